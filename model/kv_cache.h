// KV caches of pixel models (KARM and its softmax ARM baseline) for incremental decoding.
//
// A cache has one LayerKvCache per attention layer. The layer cache owns its storage and is the
// only code that reads or writes it; the model hands it each step's projections and gets the
// attention output back:
//   WritePrefix  stores a prefill's keys and values for one sequence;
//   Attend       appends S sequences' new keys and values (LibTorch tensors, any device) and
//                returns their attention over what each sequence has cached;
//   AttendRows   the same for (sequence, head) rows on raw fp32 host memory (the packed CPU
//                step, engine/cpu_decoder.h, which runs the whole step without LibTorch ops).
// Two implementations:
//   KrauseLayerCache   a KrauseRingCache (attention/decode.h): the last W keys, values and key
//                      biases per sequence (memory independent of the image size); attends with
//                      the Krause decode kernel (top-k of the causal window, RBF scores).
//   SoftmaxLayerCache  a preallocated full-length cache [slots, H, N, d] for keys and values (a
//                      fair baseline: no per-step reallocation); attends with a softmax over
//                      positions 0..p.
// PixelKvCache holds a model's layer caches and, for conditional models, each slot's class.
//
// Thread-safety: none; one engine thread owns a cache. AttendRows calls for different
// (slot, head) pairs may run concurrently (they write disjoint memory).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/attention/decode.h"
#include "model/attention/krause_attention.h"
#include "model/attention_kind.h"
#include "model/pixel_model_config.h"

namespace krause {

namespace nn {
struct ThreadScratch;
}

// One (sequence, head) of a decode step on the host: the new token's projections, where it goes,
// and where the attention output goes. All fp32, d = the cache's head_dim.
struct DecodeRow {
  int64_t slot = 0, head = 0, position = 0;
  const float* q = nullptr;  // [d]
  const float* k = nullptr;  // [d] appended at `position`
  const float* v = nullptr;  // [d] appended at `position`
  float inv_var = 1;         // Krause layers: this head's 1 / sigma^2 (softmax caches ignore it)
  float* out = nullptr;      // [d]
};

class LayerKvCache {
 public:
  virtual ~LayerKvCache() = default;

  virtual AttentionKind kind() const = 0;
  virtual int64_t slots() const = 0;
  virtual int64_t heads() const = 0;
  virtual int64_t head_dim() const = 0;
  virtual const at::Device& device() const = 0;
  virtual at::ScalarType dtype() const = 0;  // of the cached keys and values
  // Positions one slot holds: the window W (Krause) or the sequence length N (softmax).
  virtual int64_t length() const = 0;

  // Stores positions 0..T-1 of one sequence (k, v: [H, T, d], any device) in `slot`.
  virtual void WritePrefix(int64_t slot, const at::Tensor& k, const at::Tensor& v) = 0;
  // One decode step for index.size() sequences: q, k, v [S, H, d] fp32 on the cache's device;
  // appends k and v at each sequence's position and returns the attention output [S, H, d].
  // `scale`: the Krause layer's 1/sigma^2 (DecodeScale, required for Krause caches; softmax
  // caches ignore it). The caller guarantees each slot holds its sequence's earlier positions.
  // Errors name the argument; the cache is unchanged on error.
  virtual absl::StatusOr<at::Tensor> Attend(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const DecodeIndex& index,
                                            const DecodeScale* scale) = 0;
  // The same for n (sequence, head) rows on an fp32 CPU cache, in order, arguments checked by
  // the caller (CpuDecoder::Step); rows must write disjoint memory (distinct (slot, head)
  // pairs). Same kernels and order as Attend on the CPU for Krause caches, which also fetch
  // each next row's ring while the current one computes unless !fetch_next (rows of one
  // sequence, whose rings stay in the core's cache: the fetches then only cost, 12% of a
  // paper-size KARM's Score). The bits do not depend on it.
  virtual void AttendRows(const DecodeRow* rows, int64_t n, nn::ThreadScratch& scratch,
                          bool fetch_next = true) = 0;
  void AttendRow(const DecodeRow& row, nn::ThreadScratch& scratch) { AttendRows(&row, 1, scratch); }
  // What Attend runs: kAuto (the default) the decode kernel (the fused one on the CPU, the CUDA
  // one on a GPU), kWindowed LibTorch ops (KrauseDecodeStepLibTorch: the fallback a model is
  // served on when the load-time kernel check finds the kernel wrong). The softmax cache attends
  // with LibTorch ops either way and ignores it. InvalidArgument for another implementation.
  virtual absl::Status SetDecodeImpl(KrauseImpl impl) = 0;

  // The tensors holding the cache (tests and benchmarks; the models never touch them):
  // Krause {keys_t, values, bias} as KrauseRingCache lays them out; softmax {keys, values}.
  virtual std::vector<at::Tensor> Storage() = 0;
};

class KrauseLayerCache final : public LayerKvCache {
 public:
  // heads, head_dim, window and top_k as the layer's attention; dtype as KrauseRingCache::Create.
  static absl::StatusOr<std::unique_ptr<KrauseLayerCache>> Create(int64_t slots, int64_t heads,
                                                                  int64_t head_dim, int64_t window,
                                                                  int64_t top_k,
                                                                  const at::Device& device,
                                                                  at::ScalarType dtype);

  AttentionKind kind() const override { return AttentionKind::kKrause; }
  int64_t slots() const override { return ring_.slots(); }
  int64_t heads() const override { return ring_.heads(); }
  int64_t head_dim() const override { return ring_.head_dim(); }
  const at::Device& device() const override { return device_; }
  at::ScalarType dtype() const override { return ring_.dtype(); }
  int64_t length() const override { return ring_.window(); }
  void WritePrefix(int64_t slot, const at::Tensor& k, const at::Tensor& v) override;
  absl::StatusOr<at::Tensor> Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const DecodeIndex& index, const DecodeScale* scale) override;
  void AttendRows(const DecodeRow* rows, int64_t n, nn::ThreadScratch& scratch,
                  bool fetch_next = true) override;
  absl::Status SetDecodeImpl(KrauseImpl impl) override;
  std::vector<at::Tensor> Storage() override;

  KrauseRingCache& ring() { return ring_; }  // tests

 private:
  // The device is the storage's: "cuda" names the current GPU, the tensors say which (cuda:0),
  // and the decode step's arguments are compared with it.
  KrauseLayerCache(KrauseRingCache ring, int64_t top_k)
      : ring_(std::move(ring)), top_k_(top_k), device_(ring_.keys_t().device()) {}
  KrauseRingCache ring_;
  int64_t top_k_;
  at::Device device_;
  bool libtorch_decode_ = false;  // SetDecodeImpl(kWindowed)
};

class SoftmaxLayerCache final : public LayerKvCache {
 public:
  // fp32 keys and values [slots, heads, seq_len, head_dim], zero-filled; scores scaled by
  // 1 / sqrt(head_dim).
  static absl::StatusOr<std::unique_ptr<SoftmaxLayerCache>> Create(int64_t slots, int64_t heads,
                                                                   int64_t head_dim,
                                                                   int64_t seq_len,
                                                                   const at::Device& device);

  AttentionKind kind() const override { return AttentionKind::kSoftmax; }
  int64_t slots() const override { return keys_.size(0); }
  int64_t heads() const override { return keys_.size(1); }
  int64_t head_dim() const override { return keys_.size(3); }
  const at::Device& device() const override { return device_; }
  at::ScalarType dtype() const override { return keys_.scalar_type(); }
  int64_t length() const override { return keys_.size(2); }
  void WritePrefix(int64_t slot, const at::Tensor& k, const at::Tensor& v) override;
  // All sequences at once: each new key and value written at (slot, position), then attention
  // over positions 0..max(p) of the sequences' caches with the positions beyond each one's own
  // masked out. Not batch-invariant (the softmax length is the batch's); AttendRows is.
  absl::StatusOr<at::Tensor> Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const DecodeIndex& index, const DecodeScale* scale) override;
  void AttendRows(const DecodeRow* rows, int64_t n, nn::ThreadScratch& scratch,
                  bool fetch_next = true) override;
  absl::Status SetDecodeImpl(KrauseImpl impl) override;
  std::vector<at::Tensor> Storage() override { return {keys_, values_}; }

 private:
  SoftmaxLayerCache(at::Tensor keys, at::Tensor values);
  void AttendOne(const DecodeRow& row, nn::ThreadScratch& scratch);
  at::Tensor keys_, values_;  // [slots, H, N, d]
  at::Device device_;
  double scale_;  // 1 / sqrt(d)
};

class PixelKvCache {
 public:
  // A cache of `slots` sequences for a model of `config` on `device` (the CPU, or in CUDA builds
  // a GPU). `dtype` of the KARM's cached keys and values: fp32, or bf16 / fp16 on a GPU
  // (W <= 256; see KrauseRingCache::Create). The ARM's caches are fp32 (InvalidArgument
  // otherwise). ResourceExhausted when the memory cannot be had.
  static absl::StatusOr<PixelKvCache> Create(const PixelModelConfig& config, int64_t slots,
                                             const at::Device& device = at::Device(at::kCPU),
                                             at::ScalarType dtype = at::kFloat);
  // Bytes one sequence occupies over all layers (padding included).
  static int64_t BytesPerSequence(const PixelModelConfig& config,
                                  at::ScalarType dtype = at::kFloat);
  PixelKvCache() = default;

  AttentionKind kind() const { return kind_; }
  int64_t slots() const { return slots_; }
  int64_t layers() const { return static_cast<int64_t>(layers_.size()); }
  LayerKvCache& layer(int64_t l) { return *layers_[l]; }
  const LayerKvCache& layer(int64_t l) const { return *layers_[l]; }

  // Conditional models: the class row (PixelModelConfig: 0..classes-1, or null_class()) each
  // slot's sequence runs with; set when a sequence takes the slot, read by Prefill and every
  // decode step. Unconditional models: no classes (slot_classes() undefined).
  bool conditional() const { return !class_host_.empty(); }
  void SetClass(int64_t slot, int64_t class_row);
  // Every layer's LayerKvCache::SetDecodeImpl.
  absl::Status SetDecodeImpl(KrauseImpl impl);
  int64_t slot_class(int64_t slot) const { return class_host_[slot]; }
  const at::Tensor& slot_classes() const { return class_device_; }  // [slots] int64, on the device

 private:
  AttentionKind kind_ = AttentionKind::kKrause;
  int64_t slots_ = 0;
  std::vector<std::unique_ptr<LayerKvCache>> layers_;
  std::vector<int64_t> class_host_;
  at::Tensor class_device_;
};

}  // namespace krause
