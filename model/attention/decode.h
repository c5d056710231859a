// The batched Krause decode step over ring-buffer KV caches (docs/operator.md, sections 1 and 2.1,
// bias form).
//
// Each sequence owns one slot of a KrauseRingCache per layer. The slot holds the keys, values and
// key biases b = -||k||^2 / 2 of the sequence's last W positions, position p at ring column
// p mod W, so memory per sequence is independent of the image size. One step takes the new
// token of S sequences at different positions, appends its key/value/bias to each sequence's
// ring and attends over the sequence's causal window. Same kernel family and bits as the fused
// prefill (cpu_kernels.h): decoding a sequence step by step reproduces KrauseAttention with
// causal(W) at every position.
//
// Thread-safety: a step mutates the slots it is given; callers (one engine thread per model)
// must not run two steps on the same slot concurrently.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/attention/cpu_kernels.h"

namespace krause {

// Ring-buffer storage for one attention layer of a model, for `slots` sequences.
class KrauseRingCache {
 public:
  // On `device`: the CPU (the fused kernels) or, in CUDA builds, a GPU (the CUDA decode kernel).
  // Keys and values in `dtype`: fp32 or bf16 (on the CPU and on a GPU), or fp16 (on a GPU);
  // 2-byte elements halve the bytes a step reads. A new key is rounded when stored (Rounded) and
  // its bias is the rounded key's; the biases are fp32. On a GPU, window <= 2048 and head_dim <=
  // 256 (the CUDA kernels' limits), and window <= 256 for a 2-byte ring. InvalidArgument
  // otherwise.
  static absl::StatusOr<KrauseRingCache> Create(int64_t slots, int64_t heads, int64_t head_dim,
                                                int64_t window,
                                                const at::Device& device = at::Device(at::kCPU),
                                                at::ScalarType dtype = at::kFloat);
  // x as a ring of `dtype` stores it: rounded to nearest; float16 saturates at +-65504 (the
  // largest finite half: a larger key element would be inf and its scores NaN), NaN stays NaN.
  // The CUDA and CPU decode steps store new keys and values by the same rule.
  static at::Tensor Rounded(const at::Tensor& x, at::ScalarType dtype);
  // Bytes one slot takes for these dimensions and key/value dtype (padding included).
  static int64_t BytesPerSlot(int64_t heads, int64_t head_dim, int64_t window,
                              at::ScalarType dtype = at::kFloat);
  KrauseRingCache() = default;

  int64_t slots() const { return slots_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t window() const { return window_; }
  at::ScalarType dtype() const { return values_.scalar_type(); }
  // Bytes held per sequence (keys, values and biases of one slot, padding included).
  int64_t bytes_per_slot() const;

  // Storage, for the decode kernel and tests: written in place, never replaced (HostItem keeps
  // their addresses).
  const at::Tensor& keys_t() const { return keys_t_; }  // [slots, H, d, ring_stride], col p % W
  const at::Tensor& values() const { return values_; }  // [slots, H, W, d]
  const at::Tensor& bias() const { return bias_; }      // [slots, H, ring_stride]
  int64_t ring_stride() const { return ring_stride_; }
  // The decode kernel's work item for (slot, head) of a CPU ring: ring pointers, element type,
  // window, stride and d filled; the caller fills q, k, v, position, top_k, inv_var and out.
  cpu::DecodeItem HostItem(int64_t slot, int64_t head);
  // Points `item`'s prefetch hint (DecodeItem::next_kt) at the ring of (slot, head), the item
  // the caller runs next.
  void SetNext(int64_t slot, int64_t head, cpu::DecodeItem* item);

 private:
  int64_t slots_ = 0, heads_ = 0, head_dim_ = 0, window_ = 0, ring_stride_ = 0;
  at::Tensor keys_t_, values_, bias_;
  // Their addresses and the element type, read per item (a tensor's accessors check its state on
  // every call: a step of 64 sequences made 6,000 items' worth of them).
  char* keys_base_ = nullptr;
  char* values_base_ = nullptr;
  float* bias_base_ = nullptr;
  int64_t elem_bytes_ = 4;
  cpu::Elem elem_ = cpu::Elem::kFloat32;
};

struct DecodeSelection {
  at::Tensor indices;  // [S, H, min(top_k, W)] int64 absolute positions, rank order, -1 padded
  at::Tensor weights;  // [S, H, min(top_k, W)]
};

// The slots and positions of one decode step, validated once against the caches' slot count and
// copied once to the caches' device: every layer's KrauseDecodeStep of a step shares one (on a
// GPU, one upload per step instead of one per layer).
class DecodeIndex {
 public:
  //   slots:      [S] int64 CPU tensor, distinct, in [0, cache_slots).
  //   positions:  [S] int64 CPU tensor >= 0: each new token's absolute position in its sequence.
  // Pinned host tensors make the upload to a GPU asynchronous (the caller keeps them unchanged
  // until the step's results are read back).
  static absl::StatusOr<DecodeIndex> Create(const at::Tensor& slots, const at::Tensor& positions,
                                            int64_t cache_slots, const at::Device& device);
  // The same over device tensors the caller has already filled with these values (a CUDA
  // graph's fixed inputs: decode_graphs.h): validates the host values, uploads nothing.
  static absl::StatusOr<DecodeIndex> Adopt(const at::Tensor& slots, const at::Tensor& positions,
                                           int64_t cache_slots, const at::Tensor& device_slots,
                                           const at::Tensor& device_positions);
  DecodeIndex() = default;

  int64_t size() const { return size_; }
  int64_t cache_slots() const { return cache_slots_; }
  const at::Device& device() const { return device_; }
  const at::Tensor& host_slots() const { return host_slots_; }  // contiguous, CPU
  const at::Tensor& host_positions() const { return host_positions_; }
  const at::Tensor& device_slots() const { return device_slots_; }  // on device()
  const at::Tensor& device_positions() const { return device_positions_; }

 private:
  int64_t size_ = 0, cache_slots_ = 0;
  at::Device device_ = at::Device(at::kCPU);
  at::Tensor host_slots_, host_positions_, device_slots_, device_positions_;
};

// One Krause layer's 1/sigma^2 per head on a cache's device, validated once (as KrauseDecodeStep
// validates a log_sigma) for every step of that layer: a step given it reads no value back to
// the host (on a GPU, the log_sigma checks would synchronise the stream once per layer and step).
class DecodeScale {
 public:
  //   log_sigma: numel 1 or H, finite, with a finite non-zero exp(-2 log_sigma) in fp32.
  static absl::StatusOr<DecodeScale> Create(const at::Tensor& log_sigma, int64_t heads,
                                            const at::Device& device);
  DecodeScale() = default;

  const at::Tensor& inv_var() const { return inv_var_; }  // [H] fp32, contiguous, on the device

 private:
  at::Tensor inv_var_;
};

// What every layer cache's decode step checks of its arguments (KrauseDecodeStep and the softmax
// cache, model/kv_cache.h): q, k, v [S, H, d] fp32 on `device`, index.size() == S, and an index
// made for a cache of `cache_slots` slots on `device`. InvalidArgument naming the argument.
absl::Status CheckDecodeStepArgs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const DecodeIndex& index, int64_t heads, int64_t head_dim,
                                 int64_t cache_slots, const at::Device& device);

// One decode step for S sequences.
//   q, k, v:    [S, H, d] fp32 on the cache's device: the new tokens' projections.
//   scale:      the layer's DecodeScale, made for H heads on the cache's device.
//   index:      the step's slots and positions (DecodeIndex), made for this cache's slot count
//               and device. The caller guarantees each slot holds its sequence's positions
//               max(0, p - W + 1) .. p - 1.
// Returns out [S, H, d]. Errors name the argument (InvalidArgument); the cache is unchanged on
// error.
absl::StatusOr<at::Tensor> KrauseDecodeStep(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const DecodeScale& scale,
                                            int64_t top_k, const DecodeIndex& index,
                                            KrauseRingCache* cache,
                                            DecodeSelection* selection = nullptr);
// The same with log_sigma (numel 1 or H, finite) and with slots and positions given as [S] int64
// CPU tensors (a DecodeScale and a DecodeIndex made for this one call).
absl::StatusOr<at::Tensor> KrauseDecodeStep(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& log_sigma,
                                            int64_t top_k, const at::Tensor& slots,
                                            const at::Tensor& positions, KrauseRingCache* cache,
                                            DecodeSelection* selection = nullptr);

// The same step in LibTorch ops on the cache's device (the CPU or a GPU; fp32, bf16 or fp16
// rings): what a model serves on when the load-time kernel check (engine/kernel_check.h) finds
// the decode kernel wrong. Same arguments, contract and tie rule as KrauseDecodeStep; its results
// agree with the kernel's within rounding (scores summed in another order), not bit for bit.
absl::StatusOr<at::Tensor> KrauseDecodeStepLibTorch(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const DecodeScale& scale,
                                                    int64_t top_k, const DecodeIndex& index,
                                                    KrauseRingCache* cache);

#ifdef KRAUSE_WITH_CUDA
namespace internal {
// The CUDA branch of KrauseDecodeStep (cuda/dispatch_cuda.cc); arguments already validated,
// the index's device copies on the cache's GPU.
at::Tensor CudaDecodeStep(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& inv_var, int64_t top_k, const DecodeIndex& index,
                          KrauseRingCache* cache, DecodeSelection* selection);
}  // namespace internal
#endif

}  // namespace krause
