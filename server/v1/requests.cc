#include "server/v1/requests.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/edge/status.h"
#include "server/v1/images.h"

namespace krause::server {

absl::StatusOr<ParsedGenerate> ParseGenerate(const v1::GenerateRequest& req, const ServedModel& m,
                                             const FaultHook& fault) {
  ParsedGenerate out;
  const ModelInfo& info = m.info();
  GenerateAsk ask;
  ask.images = req.num_images() == 0 ? 1 : req.num_images();
  // Before the prompt is decoded (ResolveGenerate checks it again, for every front end).
  if (absl::Status st = CheckImageCount(info, ask.images); !st.ok()) return st;
  auto stream = ResolveStreamParams(
      req.update_interval_ms(),
      req.has_stream_rows() ? std::optional<bool>(req.stream_rows()) : std::nullopt);
  if (!stream.ok()) return stream.status();
  out.stream = *stream;
  if (req.has_prompt()) {
    if (fault) fault("decode");
    auto t =
        DecodeImage(req.prompt(), "prompt", ImageBounds{info.shape, m.name(), /*prompt=*/true});
    if (!t.ok()) return t.status();
    auto kept = PromptRows(*t, req.prompt_rows(), info);
    if (!kept.ok()) return kept.status();
    ask.prompt = *std::move(kept);
  } else if (req.prompt_rows() != 0) {
    return InvalidField("prompt_rows", absl::StrCat("prompt_rows is ", req.prompt_rows(),
                                                    " but there is no prompt"));
  }
  if (req.condition_case() != v1::GenerateRequest::CONDITION_NOT_SET) {
    const bool by_name = req.condition_case() == v1::GenerateRequest::kLabel;
    auto cls =
        m.ClassRow(by_name, req.label(), req.class_index(), by_name ? "label" : "class_index");
    if (!cls.ok()) return cls.status();
    ask.classes.assign(static_cast<size_t>(ask.images), *cls);
  }
  if (req.has_temperature()) ask.temperature = req.temperature();
  if (req.has_top_p()) ask.top_p = req.top_p();
  if (req.has_top_k()) ask.top_k = req.top_k();
  if (req.has_guidance()) ask.guidance = req.guidance();
  if (req.has_seed()) ask.seed = req.seed();
  ask.first_image = req.first_image();
  auto plan = ResolveGenerate(info, std::move(ask));
  if (!plan.ok()) return plan.status();
  out.plan = *std::move(plan);
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
    out.push_back(*t);
  }
  return at::stack(out, 0).contiguous();
}

absl::StatusOr<std::vector<int64_t>> ScoreClasses(const v1::ScoreRequest& req, const ServedModel& m,
                                                  int64_t n) {
  const int64_t by_name = req.labels_size(), by_index = req.class_indices_size();
  if (by_name == 0 && by_index == 0) return std::vector<int64_t>();
  if (by_name > 0 && by_index > 0)
    return InvalidField("labels", "labels and class_indices: give at most one of the two");
  const char* field = by_name > 0 ? "labels" : "class_indices";
  if (std::max(by_name, by_index) != n) {
    return InvalidField(field, absl::StrCat(field, " has ", std::max(by_name, by_index),
                                            " entries for ", n, " images (one per image)"));
  }
  std::vector<int64_t> out(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    if (by_name > 0 ? req.labels(i).empty() : req.class_indices(i) == -1) continue;
    auto cls =
        m.ClassRow(by_name > 0, by_name > 0 ? req.labels(i) : "",
                   by_index > 0 ? req.class_indices(i) : 0, absl::StrCat(field, "[", i, "]"));
    if (!cls.ok()) return cls.status();
    out[i] = *cls;
  }
  return out;
}

}  // namespace krause::server
