// KARM (Krause autoregressive pixel model) and its softmax ARM baseline, in the authors' official
// layout (docs/operator.md, section 4): pixels are 8-bit tokens in raster order (row, column,
// channel), token_emb + pos_emb, pre-LN blocks x += attn(ln1(x)); x += mlp(ln2(x)), ln_f, head ->
// 256. KARM attention: causal(W), top-k, one log_sigma per head ([H, 1, 1]). ARM: full causal
// softmax attention with 1/sqrt(d_head), projections named q_proj/k_proj/v_proj/out_proj.
//
// Sequence convention:
//   start_token = false (official checkpoints): input position t holds pixel x_t, and its logits
//     predict x_{t+1}; the first subpixel is not modelled (N - 1 scored subpixels).
//   start_token = true: input position 0 holds a learned start embedding, position t >= 1 holds
//     x_{t-1}; logits at t predict x_t, so all N subpixels are scored.
// Class conditioning (config.classes > 0): a learned class embedding `class_emb.weight`
// [classes + 1, D] is added to every position's input (the Krause window is local, so a class
// given only at the start would not reach most pixels). Row `classes` is the null class: the
// trainer drops labels to it for a share of the sequences, so one model also samples and scores
// unconditionally. Official checkpoints have classes = 0 and load and run unchanged.
// Thread-safety: Forward is const; loading is not.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/attention/decode.h"
#include "model/attention/flops.h"
#include "model/attention/krause_attention.h"
#include "model/attention_kind.h"
#include "model/nn/parameters.h"

namespace krause {

class ArmKvCache;
class CpuDecoder;

// What every decode step of a model reuses, made once by Arm::PackForDecode(): on the CPU the
// whole step packed (engine/cpu_decoder.h: batch-invariant, no LibTorch dispatch); on any device
// each Krause layer's validated 1/sigma^2 (so that a step on a GPU reads nothing back to the host
// for it).
struct ArmPackedWeights {
  std::shared_ptr<const CpuDecoder> cpu;  // null off the CPU
  std::vector<DecodeScale> scales;        // per layer (KARM); empty for the ARM

  bool linears_packed() const { return cpu != nullptr; }
};

struct ArmConfig {
  AttentionKind attention = AttentionKind::kKrause;  // JSON "krause" or "softmax" (KARM / ARM)
  int64_t height = 28, width_px = 28, channels = 1;
  int64_t width = 64, depth = 4, heads = 4;
  int64_t window = 64, top_k = 32;  // KARM only
  double sigma_init = 2.5;
  bool start_token = true;
  // Conditional generators: the number of classes (0: unconditional) and their names (empty,
  // or one per class).
  int64_t classes = 0;
  std::vector<std::string> labels;

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
  int64_t mlp() const { return 4 * width; }
  std::string ToJson() const;
  static absl::StatusOr<ArmConfig> FromJson(const std::string& json);
  absl::Status Validate() const;
};

class Arm {
 public:
  static absl::StatusOr<Arm> Create(const ArmConfig& config, uint64_t seed);

  // inputs: [B, T] int64 model inputs (see the sequence convention; with a start token, pass the
  // pixels x_0..x_{T-2} and the start embedding is prepended: T - 1 pixels give T positions).
  // Returns logits [B, T, 256] for positions 0..T-1.
  // classes: [B] int64 class rows in [0, classes] (classes: the null class) of a conditional
  // model; undefined means the null class for all. Must be undefined for unconditional models.
  at::Tensor Forward(const at::Tensor& pixels, KrauseImpl impl = KrauseImpl::kAuto,
                     const at::Tensor& classes = {}) const;

  // The model-input token that stands for the learned start embedding.
  static constexpr int64_t kStartToken = 256;

  // Model inputs u: [B, T] int64 tokens (pixels 0..255, or kStartToken at position 0 of a
  // start-token model). Returns logits [B, T, 256]: with a start token position t predicts x_t,
  // without one x_{t+1}. If `kv` is given, it receives each layer's keys and values [B, H, T, d].
  // `classes` as for Forward.
  at::Tensor ForwardTokens(const at::Tensor& u, KrauseImpl impl = KrauseImpl::kAuto,
                           std::vector<std::pair<at::Tensor, at::Tensor>>* kv = nullptr,
                           const at::Tensor& classes = {}) const;

  // Incremental decoding over a KV cache (inference only).
  // Prefill: runs u [T] (positions 0..T-1) for one sequence, stores their keys/values in `slot`
  // and returns logits [T, 256]. A conditional model runs with the class the cache holds for
  // the slot (ArmKvCache::SetClass), as DecodeStep does.
  at::Tensor Prefill(const at::Tensor& u, int64_t slot, ArmKvCache* cache) const;
  // One step for S sequences: u [S] is each sequence's token at its position positions[s] (the
  // cache holds its positions before). u, positions and slots are host (CPU) tensors whatever the
  // model's device. Appends to the cache; returns logits [S, 256] on the model's device. With
  // `packed` from the CPU, the packed step (CpuDecoder): every row's logits have the same bits
  // whatever the other rows, batch invariance for the engine; without (the reference, and the
  // GPU path: `packed` made on the GPU holds only the Krause layers' scales), LibTorch ops, and
  // for the ARM one masked attention over the whole batch.
  at::Tensor DecodeStep(const at::Tensor& u, const at::Tensor& positions, const at::Tensor& slots,
                        ArmKvCache* cache, const ArmPackedWeights* packed = nullptr) const;
  // The same with the tokens already on the model's device (u_device [S] int64) and the slots
  // and positions as a DecodeIndex made for `cache` on that device. With `packed` scales, a KARM
  // step on a GPU reads nothing back to the host: what a CUDA graph captures (decode_graphs.h).
  at::Tensor DecodeStep(const at::Tensor& u_device, const DecodeIndex& index, ArmKvCache* cache,
                        const ArmPackedWeights* packed = nullptr) const;
  // Packs the current weights for DecodeStep (call again after loading new weights): linear
  // layers on the CPU only, the Krause layers' scales on any device.
  ArmPackedWeights PackForDecode() const;

  // Teacher-forced mean negative log-likelihood in nats per scored subpixel, per image: [B].
  // images: [B, seq_len] int64 (raster order).
  // `classes` as for Forward (conditional bits/dim with a class per image).
  at::Tensor NllPerImage(const at::Tensor& images, KrauseImpl impl = KrauseImpl::kAuto,
                         const at::Tensor& classes = {}) const;

  // FLOPs per generated image (full sequence, teacher-forced equivalent).
  AttentionCost FlopsPerImage() const;

  const ArmConfig& config() const { return config_; }
  // Where the parameters are (the CPU, or a GPU after LoadModel(..., "cuda")).
  at::Device device() const;
  ParameterStore& parameters() { return params_; }
  const ParameterStore& parameters() const { return params_; }

 private:
  at::Tensor Embed(const at::Tensor& u) const;  // [..] tokens -> [.., D], no positions
  // [B, T, D]: the class embedding of each row's class (the null class when undefined).
  at::Tensor AddClass(const at::Tensor& x, const at::Tensor& classes) const;
  at::Tensor Attention(int64_t layer, const at::Tensor& x, KrauseImpl impl,
                       std::vector<std::pair<at::Tensor, at::Tensor>>* kv) const;

  ArmConfig config_;
  ParameterStore params_;
};

}  // namespace krause
