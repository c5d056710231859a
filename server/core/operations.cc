#include "server/core/operations.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/engine/sampling.h"
#include "server/core/errors.h"
#include "server/core/image_input.h"
#include "server/core/served_model.h"

namespace krause::server {
namespace {

// The setting a ValidateSampling error is about: its message starts with the setting's name
// (model/engine/sampling.cc).
absl::string_view SamplingField(const absl::Status& st) {
  for (absl::string_view f : {"temperature", "top_p", "top_k"})
    if (absl::StartsWith(st.message(), f)) return f;
  return "sampling";
}

// Image seeds live in their own part of the counter space (the pixels of an image use small
// counters with the image's seed; these use the call's seed).
constexpr uint64_t kImageStream = uint64_t{1} << 63;

}  // namespace

std::vector<int64_t> TopClasses(const float* row, int64_t classes, int64_t k) {
  std::vector<int64_t> order(static_cast<size_t>(classes));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [row](int64_t a, int64_t b) { return row[a] > row[b]; });
  order.resize(static_cast<size_t>(std::clamp<int64_t>(k, 0, classes)));
  return order;
}

std::string ClassName(const ModelInfo& info, int64_t index) {
  if (index >= 0 && index < static_cast<int64_t>(info.labels.size())) return info.labels[index];
  return std::to_string(index);
}

uint64_t ImageSeed(uint64_t seed, uint64_t image) {
  return image == 0 ? seed : CounterBits(seed, kImageStream | image);
}

absl::Status CheckImageCount(const ModelInfo& m, int64_t images) {
  if (images >= 1 && images <= m.max_images_per_request) return absl::OkStatus();
  return InvalidField(
      "num_images",
      images < 1
          ? absl::StrCat("num_images is ", images, "; model ", m.name, " generates at least 1")
          : absl::StrCat("num_images is ", images, "; model ", m.name, " allows at most ",
                         m.max_images_per_request, " per request"));
}

absl::StatusOr<std::vector<uint8_t>> PromptRows(const at::Tensor& prompt, int64_t rows,
                                                const ModelInfo& m) {
  if (rows < 1 || rows >= m.shape.height)
    return InvalidField("prompt_rows",
                        absl::StrCat("prompt_rows must be in [1, ", m.shape.height - 1,
                                     "] with a prompt, got ", rows));
  if (rows > prompt.size(0))
    return InvalidField("prompt_rows",
                        absl::StrCat("prompt_rows is ", rows, " but the prompt image has only ",
                                     prompt.size(0), " rows"));
  const at::Tensor kept = prompt.narrow(0, 0, rows).contiguous();
  return std::vector<uint8_t>(kept.data_ptr<uint8_t>(), kept.data_ptr<uint8_t>() + kept.numel());
}

absl::StatusOr<GeneratePlan> ResolveGenerate(const GenerateSettings& g, const ModelInfo& m,
                                             const ClassLookup& lookup, const FaultHook& fault) {
  GeneratePlan plan;
  const int64_t n = g.num_images == 0 ? 1 : g.num_images;
  if (absl::Status st = CheckImageCount(m, n); !st.ok()) return st;
  const int64_t interval = g.update_interval_ms == 0 ? 100 : g.update_interval_ms;
  if (interval < 10 || interval > 10000)
    return InvalidField(
        "update_interval_ms",
        absl::StrCat("update_interval_ms must be 0 (100) or in [10, 10000], got ", interval));
  plan.interval = std::chrono::milliseconds(interval);
  plan.output = g.answer_once                  ? GenerateOutput::kFinal
                : g.stream_rows.value_or(true) ? GenerateOutput::kRows
                                               : GenerateOutput::kProgress;
  plan.timeout = std::chrono::microseconds(g.timeout_us);
  std::vector<uint8_t> prompt;
  if (g.prompt) {
    if (fault) fault("decode");
    auto t = DecodeRequestImage(*g.prompt, g.prompt_field,
                                ImageBounds{m.shape, m.name, /*prompt=*/true});
    if (!t.ok()) return t.status();
    auto kept = PromptRows(*t, g.prompt_rows, m);
    if (!kept.ok()) return kept.status();
    prompt = *std::move(kept);
  } else if (g.prompt_rows != 0) {
    return InvalidField("prompt_rows", absl::StrCat("prompt_rows is ", g.prompt_rows,
                                                    " but there is no ", g.prompt_field));
  }
  std::vector<int64_t> classes = g.image_classes;
  if (g.label || g.class_index) {
    const bool by_name = g.label.has_value();
    auto cls = lookup(by_name, g.label.value_or(""), g.class_index.value_or(0),
                      by_name ? "label" : "class_index");
    if (!cls.ok()) return cls.status();
    classes.assign(static_cast<size_t>(n), *cls);
  }
  // A setting the request leaves unset gets the model's default (ModelInfo), else the engine's.
  SamplingParams sp;
  sp.temperature = g.temperature.value_or(m.default_temperature.value_or(sp.temperature));
  sp.top_p = g.top_p.value_or(m.default_top_p.value_or(sp.top_p));
  sp.top_k = g.top_k.value_or(m.default_top_k.value_or(sp.top_k));
  if (absl::Status st = ValidateSampling(sp); !st.ok()) return WithField(st, SamplingField(st));
  if (classes.empty()) classes.assign(static_cast<size_t>(n), -1);
  if (static_cast<int64_t>(classes.size()) != n)
    return InvalidField(
        "class_index", absl::StrCat(classes.size(), " classes for ", n, " images (one per image)"));
  // Without a guidance, an image with a class gets the model's default guidance, one without
  // none.
  plan.seed = g.seed ? *g.seed : std::random_device{}() * 0x100000001ull;
  plan.first_image = g.first_image;
  plan.images.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    GenerationRequest& r = plan.images[i];
    r.label = classes[i];
    r.guidance = g.guidance.value_or(r.label >= 0 ? m.default_guidance.value_or(1.0) : 1.0);
    if (const absl::Status st = ValidateGuidance(r.guidance, r.label); !st.ok()) {
      if (r.label >= 0) return WithField(st, "guidance");  // the range
      return InvalidField(
          "guidance", absl::StrCat(st.message(), "; model ", m.name,
                                   m.classes > 0 ? " was given none" : " is unconditional",
                                   n > 1 && m.classes > 0 ? absl::StrCat(" for image ", i) : ""));
    }
    r.prompt = prompt;
    r.sampling = sp;
    r.sampling.seed = ImageSeed(plan.seed, plan.first_image + static_cast<uint64_t>(i));
    plan.passes = std::max(plan.passes, GenerationRequest::SlotsFor(r.guidance));
  }
  return plan;
}

absl::StatusOr<GeneratePlan> ResolveGenerate(const GenerateSettings& settings,
                                             const ServedModel& model, const FaultHook& fault) {
  return ResolveGenerate(
      settings, model.info(),
      [&model](bool by_name, const std::string& label, int64_t index, const std::string& field) {
        return model.ClassRow(by_name, label, index, field);
      },
      fault);
}

}  // namespace krause::server
