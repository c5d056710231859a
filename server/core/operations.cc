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

absl::StatusOr<StreamParams> ResolveStreamParams(int64_t interval_ms, std::optional<bool> rows) {
  const int64_t interval = interval_ms == 0 ? 100 : interval_ms;
  if (interval < 10 || interval > 10000)
    return InvalidField(
        "update_interval_ms",
        absl::StrCat("update_interval_ms must be 0 (100) or in [10, 10000], got ", interval));
  StreamParams p;
  p.interval = std::chrono::milliseconds(interval);
  p.rows = rows.value_or(true);
  return p;
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

absl::StatusOr<GeneratePlan> ResolveGenerate(const ModelInfo& m, GenerateAsk ask) {
  if (absl::Status st = CheckImageCount(m, ask.images); !st.ok()) return st;
  // A setting the request leaves unset gets the model's default (ModelInfo), else the engine's.
  SamplingParams sp;
  sp.temperature = ask.temperature.value_or(m.default_temperature.value_or(sp.temperature));
  sp.top_p = ask.top_p.value_or(m.default_top_p.value_or(sp.top_p));
  sp.top_k = ask.top_k.value_or(m.default_top_k.value_or(sp.top_k));
  if (absl::Status st = ValidateSampling(sp); !st.ok()) return WithField(st, SamplingField(st));
  if (ask.classes.empty()) ask.classes.assign(static_cast<size_t>(ask.images), -1);
  if (static_cast<int64_t>(ask.classes.size()) != ask.images)
    return InvalidField("class_index", absl::StrCat(ask.classes.size(), " classes for ", ask.images,
                                                    " images (one per image)"));
  // Without a guidance, an image with a class gets the model's default guidance, one without
  // none.
  GeneratePlan plan;
  plan.seed = ask.seed ? *ask.seed : std::random_device{}() * 0x100000001ull;
  plan.first_image = ask.first_image;
  plan.images.resize(static_cast<size_t>(ask.images));
  for (int64_t i = 0; i < ask.images; ++i) {
    GenerationRequest& r = plan.images[i];
    r.label = ask.classes[i];
    r.guidance = ask.guidance.value_or(r.label >= 0 ? m.default_guidance.value_or(1.0) : 1.0);
    if (const absl::Status st = ValidateGuidance(r.guidance, r.label); !st.ok()) {
      if (r.label >= 0) return WithField(st, "guidance");  // the range
      return InvalidField(
          "guidance",
          absl::StrCat(st.message(), "; model ", m.name,
                       m.classes > 0 ? " was given none" : " is unconditional",
                       ask.images > 1 && m.classes > 0 ? absl::StrCat(" for image ", i) : ""));
    }
    r.prompt = ask.prompt;
    r.sampling = sp;
    r.sampling.seed = ImageSeed(plan.seed, plan.first_image + static_cast<uint64_t>(i));
    plan.passes = std::max(plan.passes, GenerationRequest::SlotsFor(r.guidance));
  }
  return plan;
}

absl::Status UnaryGeneration::Start(std::shared_ptr<ServedModel> model, GeneratePlan plan,
                                    CallLimits limits, Clock::time_point start, ReplyPool* replies,
                                    std::function<void(double)> on_queued, Done done) {
  std::shared_ptr<UnaryGeneration> g(new UnaryGeneration());
  const ImageShape& s = model->info().shape;
  const int64_t n = static_cast<int64_t>(plan.images.size());
  g->model_ = model;
  g->limits_ = std::move(limits);
  g->start_ = start;
  g->replies_ = replies;
  g->on_queued_ = std::move(on_queued);
  g->done_ = std::move(done);
  g->per_image_ = s.height * s.width * s.channels;
  g->pixels_.assign(static_cast<size_t>(n * g->per_image_), '\0');
  g->status_.resize(static_cast<size_t>(n));
  g->left_ = n;
  return model->Generate(std::move(plan.images), g);
}

void UnaryGeneration::OnUpdate(const CallUpdate& u) {
  for (const CallUpdate::Pixel& p : u.pixels)
    pixels_[static_cast<size_t>(p.image * per_image_ + p.index)] = static_cast<char>(p.value);
  if (on_queued_)
    for (size_t i = 0; i < u.admitted.size(); ++i)
      on_queued_(std::chrono::duration<double>(u.admitted_at - start_).count());
  for (const CallUpdate::Done& d : u.done) {
    status_[d.image] = d.status;
    --left_;
  }
  stopping_ = stopping_ || u.stopping;
  if (left_ > 0 && !stopped_) {
    if (u.now >= limits_.deadline) {
      stopped_ = true;
      why_ = absl::DeadlineExceededError("deadline exceeded; generation stopped");
    } else if (limits_.cancelled && limits_.cancelled()) {
      stopped_ = true;
      why_ = absl::CancelledError("cancelled by the client");
    }
    if (stopped_) model_->CancelGeneration(this);
  }
  if (left_ > 0) return;
  replies_->Post([self = shared_from_this()] { self->Finish(); });
}

void UnaryGeneration::Finish() {
  absl::Status st;
  for (const absl::Status& s : status_) {
    if (s.ok()) continue;
    st = !why_.ok() ? why_
         : stopping_
             ? Refusal("the server is shutting down; generation was cancelled", reason::kDraining)
             : s;
    break;
  }
  if (st.ok()) {
    done_(std::move(pixels_));
  } else {
    done_(st);
  }
}

}  // namespace krause::server
