// The configuration of a pixel model (KARM or its softmax ARM baseline): image shape, model size,
// attention kind and its parameters, class conditioning. Stored as the checkpoint's JSON config in
// the official keys (docs/operator.md, section 4): the model width d_model is the key "width";
// "width_px" is the image width. Conditional configs add "classes" and "labels" (and
// "class_norm" when set).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/attention_kind.h"

namespace krause {

struct PixelModelConfig {
  AttentionKind attention = AttentionKind::kKrause;  // JSON "krause" or "softmax" (KARM / ARM)
  int64_t height = 28, width_px = 28, channels = 1;
  int64_t d_model = 64, depth = 4, heads = 4;  // JSON "width" (the official key)
  int64_t window = 64, top_k = 32;             // KARM only
  double sigma_init = 2.5;
  bool start_token = true;
  // Conditional generators: the number of classes (0: unconditional) and their names (empty,
  // or one per class).
  int64_t classes = 0;
  std::vector<std::string> labels;
  // Conditional models only: the class also scales and shifts every LayerNorm's output
  // (ln1, ln2 of each layer and ln_f: h * (1 + scale[c]) + shift[c], a learned [classes + 1, d]
  // pair per norm, zero at initialisation), as adaptive LayerNorm does, besides the class
  // embedding added to the input. JSON "class_norm" (absent: false).
  bool class_norm = false;

  bool conditional() const { return classes > 0; }
  // The class-embedding row of "no class" (conditional models only).
  int64_t null_class() const { return classes; }
  // The class-embedding row for a requested class (-1: none; the null class of a conditional
  // model). InvalidArgument for a class on an unconditional model or one out of range.
  absl::StatusOr<int64_t> ClassRow(int64_t label) const;
  // The class named `label` (exact match). InvalidArgument naming the valid labels, or saying
  // the model is unconditional or names no classes.
  absl::StatusOr<int64_t> ClassOfLabel(const std::string& label) const;
  int64_t seq_len() const { return height * width_px * channels; }
  int64_t mlp() const { return 4 * d_model; }
  std::string ToJson() const;
  static absl::StatusOr<PixelModelConfig> FromJson(const std::string& json);
  absl::Status Validate() const;
};

}  // namespace krause
