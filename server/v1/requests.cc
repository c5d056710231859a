#include "server/v1/requests.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/edge/status.h"
#include "server/v1/images.h"

namespace krause::server {

absl::StatusOr<GenerateSettings> SettingsOf(const v1::GenerateRequest& req) {
  GenerateSettings g;
  g.num_images = req.num_images();
  if (req.has_seed()) g.seed = req.seed();
  if (req.has_temperature()) g.temperature = req.temperature();
  if (req.has_top_p()) g.top_p = req.top_p();
  if (req.has_top_k()) g.top_k = req.top_k();
  if (req.has_guidance()) g.guidance = req.guidance();
  if (req.condition_case() == v1::GenerateRequest::kLabel) g.label = req.label();
  if (req.condition_case() == v1::GenerateRequest::kClassIndex) g.class_index = req.class_index();
  if (req.has_prompt()) {
    const v1::Image& p = req.prompt();
    RequestImage im;
    if (p.data_case() == v1::Image::kPng) {
      im.bytes = p.png();
      g.prompt_field = "prompt.png";
    } else if (p.data_case() == v1::Image::kRaw) {
      im.png = false;
      im.bytes = p.raw().pixels();
      im.height = p.raw().height();
      im.width = p.raw().width();
      im.channels = p.raw().channels();
    } else {
      return InvalidField("prompt", "prompt has neither png nor raw data");
    }
    g.prompt = std::move(im);
  }
  g.prompt_rows = req.prompt_rows();
  g.first_image = req.first_image();
  g.priority = req.priority();
  g.update_interval_ms = req.update_interval_ms();
  if (req.has_stream_rows()) g.stream_rows = req.stream_rows();
  return g;
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
