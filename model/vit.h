// Krause ViT and its softmax baseline (the same backbone, only the attention differs), in the
// authors' official layout (docs/operator.md, section 4): conv patch embedding, CLS token, learned
// absolute positions, post-LN blocks x = norm1(x + attn(x)); x = norm2(x + ffn(x)), a final
// LayerNorm and a linear head on the CLS token (mean of the patch tokens when cls is off).
//
// Krause attention uses the grid neighbourhood (radius, metric, CLS), one log_sigma per layer and
// the top-k schedule round(linspace(k, 2k, depth)). Device-agnostic; Forward picks a
// differentiable operator when gradients are on (the fused CPU training path for fp32 CPU
// tensors, else the windowed one) and the fused CPU kernel for CPU inference.
// Thread-safety: Forward is const and may run concurrently with itself; loading is not.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/attention/attention_trace.h"
#include "model/attention/flops.h"
#include "model/attention/krause_attention.h"
#include "model/attention_kind.h"
#include "model/nn/parameters.h"

namespace krause {

struct ViTConfig {
  AttentionKind attention = AttentionKind::kKrause;  // JSON "krause" or "softmax"
  int64_t image_size = 28, channels = 1, patch = 4;
  int64_t d_model = 64, depth = 4, heads = 4, mlp = 128, classes = 10;  // d_model: JSON "width"
  int64_t radius = 1;
  GridMetric metric = GridMetric::kManhattan;
  int64_t top_k = 2;  // the schedule runs from top_k to 2 * top_k over depth
  double sigma_init = 2.5;
  bool cls = true;
  std::vector<std::string> labels;  // class names, optional
  // Input normalisation applied to pixels / 255, per channel (empty: none).
  std::vector<double> mean, std;

  int64_t grid() const { return image_size / patch; }
  int64_t tokens() const { return grid() * grid() + (cls ? 1 : 0); }
  std::vector<int64_t> TopKSchedule() const;
  std::string ToJson() const;
  static absl::StatusOr<ViTConfig> FromJson(const std::string& json);
  absl::Status Validate() const;
};

// pixels [B, C, H, W] uint8 (any device) -> the model's input on the same device: float
// pixels / 255, then (x - mean) / std per channel when the config has a normalisation.
at::Tensor NormalizePixels(const ViTConfig& c, const at::Tensor& pixels);

class ViT {
 public:
  // Random initialisation (seeded), in the official layout.
  static absl::StatusOr<ViT> Create(const ViTConfig& config, uint64_t seed);

  // images: [B, C, H, W] float, normalised. Returns logits [B, classes].
  // `impl` forces an attention implementation (tests); kAuto otherwise.
  // `trace`: records the attention of the layers it names (attention_trace.h).
  at::Tensor Forward(const at::Tensor& images, KrauseImpl impl = KrauseImpl::kAuto,
                     AttentionTrace* trace = nullptr) const;
  // The head's input [B, D]: the final LayerNorm's CLS token (or token mean without CLS);
  // Forward is head(Features). Sample-quality metrics compare these (model/eval/).
  at::Tensor Features(const at::Tensor& images, KrauseImpl impl = KrauseImpl::kAuto,
                      AttentionTrace* trace = nullptr) const;

  // Executed and dense-equivalent FLOPs per image (docs/operator.md, section 3).
  AttentionCost FlopsPerImage() const;

  const ViTConfig& config() const { return config_; }
  ParameterStore& parameters() { return params_; }
  const ParameterStore& parameters() const { return params_; }
  // Derived buffers of the official checkpoints, ignored when loading.
  static const std::set<std::string>& IgnoredCheckpointNames();

 private:
  at::Tensor Attention(int64_t layer, const at::Tensor& x, KrauseImpl impl,
                       AttentionTrace* trace) const;

  ViTConfig config_;
  ParameterStore params_;
};

}  // namespace krause
