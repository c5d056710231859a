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
#include "model/attention/attention_trace.h"
#include "model/attention/decode.h"
#include "model/attention/flops.h"
#include "model/attention/krause_attention.h"
#include "model/attention_kind.h"
#include "model/nn/parameters.h"
#include "model/pixel_model_config.h"

namespace krause {

class PixelKvCache;

// A model's whole decode step on the host with packed weights and no LibTorch ops: the engine's
// CpuDecoder (engine/cpu_decoder.h) implements it; PixelModel::DecodeStep runs it when given.
class PackedDecodeStep {
 public:
  virtual ~PackedDecodeStep() = default;
  // One step for s sequences (host arrays of s entries): u[i] the model-input token of sequence i
  // at position positions[i] in cache slot slots[i]. Appends to the cache and writes logits
  // [s, 256] (row-major). InvalidArgument naming the entry for bad input; nothing written then.
  virtual absl::Status Step(const int64_t* u, const int64_t* positions, const int64_t* slots,
                            int64_t s, PixelKvCache* cache, float* logits) const = 0;
  // Positions 0..t-1 of one sequence (u: t host tokens) into `slot`, with every row's arithmetic
  // exactly that of t single-sequence Steps at positions 0, 1, ..., t-1: the same cache contents
  // and the same logits [t, 256] bit for bit, so a sequence prefilled from a prefix continues
  // exactly as the uninterrupted sequence did. InvalidArgument as Step; nothing written then.
  virtual absl::Status Prefill(const int64_t* u, int64_t t, int64_t slot, PixelKvCache* cache,
                               float* logits) const = 0;
};

// What every decode step of a model reuses, made once by PackForDecode (engine/cpu_decoder.h):
// on the CPU the whole step packed (batch-invariant, no LibTorch dispatch); on any device each
// Krause layer's validated 1/sigma^2 (so that a step on a GPU reads nothing back to the host for
// it).
struct PixelDecodeWeights {
  std::shared_ptr<const PackedDecodeStep> cpu;  // null off the CPU
  std::vector<DecodeScale> scales;              // per layer (KARM); empty for the ARM

  bool linears_packed() const { return cpu != nullptr; }
};

class PixelModel {
 public:
  static absl::StatusOr<PixelModel> Create(const PixelModelConfig& config, uint64_t seed);

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
  // `classes` as for Forward. `trace`: records the attention of the layers it names
  // (attention_trace.h; the ARM's probabilities are computed for it in the reference form).
  at::Tensor ForwardTokens(const at::Tensor& u, KrauseImpl impl = KrauseImpl::kAuto,
                           std::vector<std::pair<at::Tensor, at::Tensor>>* kv = nullptr,
                           const at::Tensor& classes = {}, AttentionTrace* trace = nullptr) const;

  // Incremental decoding over a KV cache (inference only).
  // Prefill: runs u [T] (positions 0..T-1) for one sequence, stores their keys/values in `slot`
  // and returns logits [T, 256]. A conditional model runs with the class the cache holds for
  // the slot (PixelKvCache::SetClass), as DecodeStep does. `impl`: the attention's (as Forward).
  // With `packed` from the CPU (and impl kAuto or kFusedCpu), the packed prefill
  // (PackedDecodeStep::Prefill): bit for bit what decode steps over the same positions give,
  // which is what makes a completion of an image's prefix continue it exactly.
  at::Tensor Prefill(const at::Tensor& u, int64_t slot, PixelKvCache* cache,
                     KrauseImpl impl = KrauseImpl::kAuto,
                     const PixelDecodeWeights* packed = nullptr) const;
  // One step for S sequences: u [S] is each sequence's token at its position positions[s] (the
  // cache holds its positions before). u, positions and slots are host (CPU) tensors whatever the
  // model's device. Appends to the cache; returns logits [S, 256] on the model's device. With
  // `packed` from the CPU, the packed step (CpuDecoder): every row's logits have the same bits
  // whatever the other rows, batch invariance for the engine; without (the reference, and the
  // GPU path: `packed` made on the GPU holds only the Krause layers' scales), LibTorch ops, and
  // for the ARM one masked attention over the whole batch.
  at::Tensor DecodeStep(const at::Tensor& u, const at::Tensor& positions, const at::Tensor& slots,
                        PixelKvCache* cache, const PixelDecodeWeights* packed = nullptr) const;
  // The same with the tokens already on the model's device (u_device [S] int64) and the slots
  // and positions as a DecodeIndex made for `cache` on that device. With `packed` scales, a KARM
  // step on a GPU reads nothing back to the host: what a CUDA graph captures (decode_graphs.h).
  at::Tensor DecodeStep(const at::Tensor& u_device, const DecodeIndex& index, PixelKvCache* cache,
                        const PixelDecodeWeights* packed = nullptr) const;
  // Each Krause layer's 1/sigma^2 validated on the model's device (empty for the ARM); part of
  // PackForDecode's result (call again after loading new weights).
  absl::StatusOr<std::vector<DecodeScale>> DecodeScales() const;

  // Teacher-forced mean negative log-likelihood in nats per scored subpixel, per image: [B].
  // images: [B, seq_len] int64 (raster order).
  // `classes` as for Forward (conditional bits/dim with a class per image).
  at::Tensor NllPerImage(const at::Tensor& images, KrauseImpl impl = KrauseImpl::kAuto,
                         const at::Tensor& classes = {}) const;

  // FLOPs per generated image (full sequence, teacher-forced equivalent).
  AttentionCost FlopsPerImage() const;

  const PixelModelConfig& config() const { return config_; }
  // Where the parameters are (the CPU, or a GPU after LoadModel(..., "cuda")).
  at::Device device() const;
  ParameterStore& parameters() { return params_; }
  const ParameterStore& parameters() const { return params_; }

 private:
  at::Tensor Embed(const at::Tensor& u) const;  // [..] tokens -> [.., D], no positions
  // A conditional model's class rows [B] (int64 on the model's device): `classes`, or the null
  // class for every row when undefined. Undefined for an unconditional model (which must be
  // given no classes).
  at::Tensor ClassRows(const at::Tensor& classes, int64_t b) const;
  // LayerNorm `name` of x ([B, T, D] or [S, D]); with class_norm, then h * (1 + scale[rows]) +
  // shift[rows] for each row's class (rows [B] or [S]).
  at::Tensor Norm(const std::string& name, const at::Tensor& x, const at::Tensor& rows) const;
  at::Tensor Attention(int64_t layer, const at::Tensor& x, KrauseImpl impl,
                       std::vector<std::pair<at::Tensor, at::Tensor>>* kv,
                       AttentionTrace* trace) const;

  PixelModelConfig config_;
  ParameterStore params_;
};

}  // namespace krause
