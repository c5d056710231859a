// KV caches for generation and the pool of their slots.
//
// ArmKvCache holds the keys and values of up to `slots` sequences of one generator model:
//   KARM: per layer a KrauseRingCache (the last W keys, values and key biases, slot memory
//         independent of the image size);
//   ARM:  per layer a preallocated full-length cache [slots, H, N, d] for keys and for values
//         (a fair baseline: no per-step reallocation).
// SlotPool tracks which slots are in use: Reserve() has no side effects and tells whether (and
// which) slot is free, Commit() takes it, Release() frees it; a full pool is a status the
// scheduler handles (the request waits), not an error.
//
// Thread-safety: none; one engine thread owns a cache and its pool.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/attention/decode.h"

namespace krause {

struct ArmConfig;

class SlotPool {
 public:
  explicit SlotPool(int64_t capacity);
  // The lowest free slot, without taking it; Unavailable when every slot is in use.
  absl::StatusOr<int64_t> Reserve() const;
  void Commit(int64_t slot);   // precondition: slot is free
  void Release(int64_t slot);  // precondition: slot is in use
  bool InUse(int64_t slot) const { return used_[slot]; }
  int64_t capacity() const { return static_cast<int64_t>(used_.size()); }
  int64_t in_use() const { return in_use_; }

 private:
  std::vector<bool> used_;
  int64_t in_use_ = 0;
};

class ArmKvCache {
 public:
  // On `device`: the CPU, or in CUDA builds a GPU (ring caches for the CUDA decode kernel).
  // `dtype` of the KARM's cached keys and values: fp32, or bf16 / fp16 on a GPU (W <= 256; see
  // KrauseRingCache::Create). The ARM's caches are fp32 (InvalidArgument otherwise).
  static absl::StatusOr<ArmKvCache> Create(const ArmConfig& config, int64_t slots,
                                           const at::Device& device = at::Device(at::kCPU),
                                           at::ScalarType dtype = at::kFloat);
  // Bytes one sequence occupies over all layers (padding included).
  static int64_t BytesPerSequence(const ArmConfig& config, at::ScalarType dtype = at::kFloat);
  ArmKvCache() = default;

  bool krause() const { return !rings_.empty(); }
  int64_t slots() const { return slots_; }
  KrauseRingCache& ring(int64_t layer) { return rings_[layer]; }
  at::Tensor& keys(int64_t layer) { return keys_[layer]; }      // ARM: [slots, H, N, d]
  at::Tensor& values(int64_t layer) { return values_[layer]; }  // ARM: [slots, H, N, d]

  // Conditional models: the class row (ArmConfig: 0..classes-1, or null_class()) each slot's
  // sequence runs with; set when a sequence takes the slot, read by Prefill and every decode
  // step. Unconditional models: no classes (slot_classes() undefined).
  bool conditional() const { return !class_host_.empty(); }
  void SetClass(int64_t slot, int64_t class_row);
  int64_t slot_class(int64_t slot) const { return class_host_[slot]; }
  const at::Tensor& slot_classes() const { return class_device_; }  // [slots] int64, on the device

  // Stores positions 0..T-1 of one sequence (k, v: [H, T, d], from a prefill) in `slot`: the
  // last W of them for KARM, all of them for ARM.
  void WritePrefix(int64_t layer, int64_t slot, const at::Tensor& k, const at::Tensor& v);

 private:
  int64_t slots_ = 0;
  std::vector<KrauseRingCache> rings_;
  std::vector<at::Tensor> keys_, values_;
  std::vector<int64_t> class_host_;
  at::Tensor class_device_;
};

}  // namespace krause
