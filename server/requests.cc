#include "server/requests.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/images.h"
#include "server/status.h"

namespace krause::server {
namespace {

// The request field a ValidateSampling error is about: its message starts with the field's name
// (model/engine/sampling.cc).
absl::string_view SamplingField(const absl::Status& st) {
  for (absl::string_view f : {"temperature", "top_p", "top_k"})
    if (absl::StartsWith(st.message(), f)) return f;
  return "sampling";
}

}  // namespace

std::vector<GenerationRequest> ImageRequests(const GenerateParams& p) {
  std::vector<GenerationRequest> out(static_cast<size_t>(p.images));
  for (int64_t i = 0; i < p.images; ++i) {
    GenerationRequest& r = out[i];
    r.prompt = p.prompt;
    r.sampling = p.sampling;
    r.sampling.seed = p.sampling.seed + static_cast<uint64_t>(i);
    r.label = p.label;
    r.guidance = p.guidance;
  }
  return out;
}

absl::StatusOr<ParsedGenerate> ParseGenerate(const v1::GenerateRequest& req,
                                             const ServedGenerator& m, const FaultHook& fault) {
  ParsedGenerate out;
  GenerateParams& p = out.params;
  const ModelInfo& info = m.info();
  p.images = req.num_images() == 0 ? 1 : req.num_images();
  if (p.images > info.max_images_per_request)
    return InvalidField("num_images", absl::StrCat("num_images is ", p.images, "; model ", m.name(),
                                                   " allows at most ", info.max_images_per_request,
                                                   " per request"));
  // A field the request leaves unset gets the model's default (ModelInfo), else the engine's.
  SamplingParams& sp = p.sampling;
  sp.temperature =
      req.has_temperature() ? req.temperature() : info.default_temperature.value_or(1.0);
  sp.top_p = req.has_top_p() ? req.top_p() : info.default_top_p.value_or(1.0);
  sp.top_k = req.top_k() != 0 ? req.top_k() : info.default_top_k.value_or(0);
  if (absl::Status st = ValidateSampling(sp); !st.ok()) return WithField(st, SamplingField(st));
  const int64_t interval = req.update_interval_ms() == 0 ? 100 : req.update_interval_ms();
  if (interval < 10 || interval > 10000)
    return InvalidField(
        "update_interval_ms",
        absl::StrCat("update_interval_ms must be 0 (100) or in [10, 10000], got ", interval));
  out.stream.interval = std::chrono::milliseconds(interval);
  out.stream.rows = !req.has_stream_rows() || req.stream_rows();
  if (req.has_prompt()) {
    if (fault) fault("decode");
    auto t =
        DecodeImage(req.prompt(), "prompt", ImageBounds{info.shape, m.name(), /*prompt=*/true});
    if (!t.ok()) return t.status();
    const int64_t rows = req.prompt_rows();
    if (rows < 1 || rows >= info.shape.height)
      return InvalidField("prompt_rows",
                          absl::StrCat("prompt_rows must be in [1, ", info.shape.height - 1,
                                       "] with a prompt, got ", rows));
    if (rows > t->size(0))
      return InvalidField("prompt_rows",
                          absl::StrCat("prompt_rows is ", rows, " but the prompt image has only ",
                                       t->size(0), " rows"));
    const at::Tensor kept = t->narrow(0, 0, rows).contiguous();
    p.prompt.assign(kept.data_ptr<uint8_t>(), kept.data_ptr<uint8_t>() + kept.numel());
  } else if (req.prompt_rows() != 0) {
    return InvalidField("prompt_rows", absl::StrCat("prompt_rows is ", req.prompt_rows(),
                                                    " but there is no prompt"));
  }
  const PixelModelConfig& c = m.config();
  if (req.condition_case() != v1::GenerateRequest::CONDITION_NOT_SET) {
    auto cls = RequestedClass(m, req.condition_case() == v1::GenerateRequest::kLabel, req.label(),
                              req.class_index());
    if (!cls.ok()) return cls.status();
    p.label = *cls;
  }
  // The model's default guidance applies to requests with a class.
  p.guidance = req.has_guidance() ? req.guidance()
               : p.label >= 0     ? info.default_guidance.value_or(1.0)
                                  : 1.0;
  if (const absl::Status st = ValidateGuidance(p.guidance, p.label); !st.ok()) {
    if (p.label >= 0) return WithField(st, "guidance");  // the range
    return InvalidField("guidance",
                        absl::StrCat(st.message(), "; model ", m.name(),
                                     c.conditional() ? " was given none (label or class_index)"
                                                     : " is unconditional"));
  }
  sp.seed = req.has_seed() ? req.seed() : std::random_device{}() * 0x100000001ull;
  return out;
}

absl::StatusOr<at::Tensor> DecodeImages(const google::protobuf::RepeatedPtrField<v1::Image>& images,
                                        const ServedModel& m, const FaultHook& fault) {
  const ModelInfo& info = m.info();
  if (images.empty()) return InvalidField("images", "images is empty (send 1 or more images)");
  if (images.size() > info.max_images_per_request)
    return InvalidField(
        "images", absl::StrCat("images has ", images.size(), " images; model ", m.name(),
                               " takes at most ", info.max_images_per_request, " per request"));
  std::vector<at::Tensor> out;
  out.reserve(images.size());
  for (int i = 0; i < images.size(); ++i) {
    const std::string field = absl::StrCat("images[", i, "]");
    if (fault) fault("decode");
    auto t = DecodeImage(images[i], field, ImageBounds{info.shape, m.name()});
    if (!t.ok()) return t.status();
    out.push_back(t->permute({2, 0, 1}));
  }
  return at::stack(out, 0).contiguous();
}

absl::StatusOr<int64_t> RequestedClass(const ServedGenerator& m, bool by_name,
                                       const std::string& label, int64_t class_index) {
  const PixelModelConfig& c = m.config();
  auto cls = by_name ? c.ClassOfLabel(label) : c.ClassRow(class_index);
  if (cls.ok()) return cls;
  const char* field = by_name ? "label" : "class_index";
  return InvalidField(field,
                      absl::StrCat(field, ": model ", m.name(), ": ", cls.status().message()));
}

absl::StatusOr<std::vector<int64_t>> ScoreClasses(const v1::ScoreRequest& req,
                                                  const ServedGenerator& m, int64_t n) {
  const int64_t by_name = req.labels_size(), by_index = req.class_indices_size();
  if (by_name == 0 && by_index == 0) return std::vector<int64_t>();
  if (by_name > 0 && by_index > 0)
    return InvalidField("labels", "labels and class_indices: give at most one of the two");
  const char* field = by_name > 0 ? "labels" : "class_indices";
  if (std::max(by_name, by_index) != n) {
    return InvalidField(field, absl::StrCat(field, " has ", std::max(by_name, by_index),
                                            " entries for ", n, " images (one per image)"));
  }
  const PixelModelConfig& c = m.config();
  std::vector<int64_t> out(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    absl::StatusOr<int64_t> cls = -1;
    if (by_name > 0 && !req.labels(i).empty()) {
      cls = c.ClassOfLabel(req.labels(i));
    } else if (by_index > 0 && req.class_indices(i) != -1) {
      cls = req.class_indices(i) < -1 ? absl::InvalidArgumentError(absl::StrCat(
                                            "class ", req.class_indices(i), " is below -1 (none)"))
                                      : c.ClassRow(req.class_indices(i));
    }
    if (!cls.ok()) {
      const std::string entry = absl::StrCat(field, "[", i, "]");
      return InvalidField(entry,
                          absl::StrCat(entry, ": model ", m.name(), ": ", cls.status().message()));
    }
    out[i] = *cls;
  }
  return out;
}

}  // namespace krause::server
