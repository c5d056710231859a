#include "model/pixel_model_config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {

std::string PixelModelConfig::ToJson() const {
  nlohmann::json j = {{"model", "arm"},           {"attention", AttentionKindName(attention)},
                      {"height", height},         {"width_px", width_px},
                      {"channels", channels},     {"width", d_model},
                      {"depth", depth},           {"heads", heads},
                      {"window", window},         {"top_k", top_k},
                      {"sigma_init", sigma_init}, {"start_token", start_token}};
  // Unconditional configs keep the official keys only (their JSON is unchanged).
  if (classes > 0) {
    j["classes"] = classes;
    j["labels"] = labels;
    if (class_norm) j["class_norm"] = true;
  }
  return j.dump();
}

absl::StatusOr<PixelModelConfig> PixelModelConfig::FromJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError("config: not a JSON object");
  PixelModelConfig c;
  try {
    if (j.value("model", "arm") != "arm")
      return absl::InvalidArgumentError("config: model is not \"arm\"");
    absl::StatusOr<AttentionKind> kind =
        ParseAttentionKind(j.value("attention", std::string(AttentionKindName(c.attention))));
    if (!kind.ok()) return kind.status();
    c.attention = *kind;
    c.height = j.value("height", c.height);
    c.width_px = j.value("width_px", c.width_px);
    c.channels = j.value("channels", c.channels);
    c.d_model = j.value("width", c.d_model);
    c.depth = j.value("depth", c.depth);
    c.heads = j.value("heads", c.heads);
    c.window = j.value("window", c.window);
    c.top_k = j.value("top_k", c.top_k);
    c.sigma_init = j.value("sigma_init", c.sigma_init);
    c.start_token = j.value("start_token", c.start_token);
    c.classes = j.value("classes", c.classes);
    c.labels = j.value("labels", c.labels);
    c.class_norm = j.value("class_norm", c.class_norm);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", ExceptionMessage(e)));
  }
  RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::Status PixelModelConfig::Validate() const {
  if (height < 1 || width_px < 1 || channels < 1) {
    return absl::InvalidArgumentError("config: height, width_px and channels must be >= 1");
  }
  if (d_model < 1 || heads < 1 || d_model % heads != 0 || depth < 1) {
    return absl::InvalidArgumentError(absl::StrCat("config: width (d_model) ", d_model,
                                                   " must be a multiple of heads ", heads,
                                                   ", depth >= 1"));
  }
  if (classes < 0 || (!labels.empty() && static_cast<int64_t>(labels.size()) != classes)) {
    return absl::InvalidArgumentError(absl::StrCat("config: classes ", classes,
                                                   " must be >= 0 with 0 or `classes` labels, got ",
                                                   labels.size(), " labels"));
  }
  if (class_norm && classes == 0) {
    return absl::InvalidArgumentError("config: class_norm needs a conditional model (classes > 0)");
  }
  if (attention == AttentionKind::kKrause && (window < 1 || top_k < 1 || !(sigma_init > 0))) {
    return absl::InvalidArgumentError("config: window, top_k and sigma_init must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PixelModelConfig::ClassRow(int64_t label) const {
  if (label < 0) return conditional() ? null_class() : -1;
  if (!conditional()) {
    return absl::InvalidArgumentError(
        absl::StrCat("class ", label, " given, but the model is unconditional (no classes)"));
  }
  if (label >= classes) {
    return absl::InvalidArgumentError(
        absl::StrCat("class ", label, " is outside [0, ", classes, ")"));
  }
  return label;
}

absl::StatusOr<int64_t> PixelModelConfig::ClassOfLabel(const std::string& label) const {
  if (!conditional()) {
    return absl::InvalidArgumentError(
        absl::StrCat("class \"", label, "\" given, but the model is unconditional (no classes)"));
  }
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] == label) return static_cast<int64_t>(i);
  if (labels.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("class \"", label, "\": the model names no ",
                                                   "classes; give an index in [0, ", classes, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "class \"", label, "\" is unknown; valid labels: ", absl::StrJoin(labels, ", ")));
}

}  // namespace krause
