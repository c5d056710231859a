#include "model/engine/kv_cache.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "model/karm.h"

namespace krause {

SlotPool::SlotPool(int64_t capacity) : used_(static_cast<size_t>(capacity), false) {}

absl::StatusOr<int64_t> SlotPool::Reserve() const {
  for (size_t i = 0; i < used_.size(); ++i) {
    if (!used_[i]) return static_cast<int64_t>(i);
  }
  return absl::UnavailableError(absl::StrCat("all ", used_.size(), " cache slots are in use"));
}

void SlotPool::Commit(int64_t slot) {
  TORCH_CHECK(!used_[slot], "slot ", slot, " committed twice");
  used_[slot] = true;
  ++in_use_;
}

void SlotPool::Release(int64_t slot) {
  TORCH_CHECK(used_[slot], "slot ", slot, " released twice");
  used_[slot] = false;
  --in_use_;
}

absl::StatusOr<ArmKvCache> ArmKvCache::Create(const ArmConfig& c, int64_t slots,
                                              const at::Device& device, at::ScalarType dtype) {
  if (slots < 1)
    return absl::InvalidArgumentError(absl::StrCat("cache slots must be >= 1, got ", slots));
  if (c.attention != AttentionKind::kKrause && dtype != at::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ARM's KV cache is float32; ", c10::toString(dtype), " caches are for KARM rings"));
  }
  ArmKvCache cache;
  cache.slots_ = slots;
  const int64_t dh = c.width / c.heads;
  try {
    for (int64_t l = 0; l < c.depth; ++l) {
      if (c.attention == AttentionKind::kKrause) {
        auto ring = KrauseRingCache::Create(slots, c.heads, dh, c.window, device, dtype);
        if (!ring.ok()) return ring.status();
        cache.rings_.push_back(std::move(ring).value());
      } else {
        const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
        cache.keys_.push_back(at::zeros({slots, c.heads, c.seq_len(), dh}, opts));
        cache.values_.push_back(at::zeros({slots, c.heads, c.seq_len(), dh}, opts));
      }
    }
    if (c.classes > 0) {
      cache.class_host_.assign(slots, c.null_class());
      cache.class_device_ =
          at::full({slots}, c.null_class(), at::TensorOptions().dtype(at::kLong).device(device));
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the KV cache: ", e.what()));
  }
  return cache;
}

int64_t ArmKvCache::BytesPerSequence(const ArmConfig& c, at::ScalarType dtype) {
  const int64_t dh = c.width / c.heads;
  if (c.attention == AttentionKind::kKrause) {
    return c.depth * KrauseRingCache::BytesPerSlot(c.heads, dh, c.window, dtype);
  }
  return c.depth * c.heads * c.seq_len() * dh * 2 * 4;
}

void ArmKvCache::SetClass(int64_t slot, int64_t class_row) {
  class_host_[slot] = class_row;
  class_device_[slot].fill_(class_row);
}

void ArmKvCache::WritePrefix(int64_t layer, int64_t slot, const at::Tensor& k,
                             const at::Tensor& v) {
  at::NoGradGuard no_grad;
  const int64_t t = k.size(1);
  if (!krause()) {
    keys_[layer][slot].narrow(1, 0, t).copy_(k);
    values_[layer][slot].narrow(1, 0, t).copy_(v);
    return;
  }
  KrauseRingCache& ring = rings_[layer];
  const int64_t w = ring.window(), d = ring.head_dim();
  const at::Device dev = ring.values().device();
  // The keys as the ring holds them (a bf16 / fp16 cache rounds them); the biases are theirs.
  const at::Tensor stored = k.to(dev, ring.dtype()).contiguous();
  at::Tensor bias;
  if (dev.is_cpu()) {
    // With the CPU decode kernel's own function, so that prefill and CPU decode agree bit for bit
    // (a CPU ring is fp32).
    bias = at::empty({k.size(0), t}, at::kFloat);
    for (int64_t h = 0; h < k.size(0); ++h) {
      cpu::CpuKernels().key_biases(stored[h].data_ptr<float>(), t, d, bias[h].data_ptr<float>());
    }
  } else {
    // On a GPU, computed there (no download); the sum's order is not the decode kernel's, so a
    // few ulp apart from it.
    const at::Tensor kf = stored.to(at::kFloat);
    bias = -0.5 * (kf * kf).sum(-1);
  }
  // The last min(T, W) positions p go to ring column p % W: one index_copy_ per tensor.
  const int64_t first = std::max<int64_t>(0, t - w), count = t - first;
  const at::Tensor cols =
      at::arange(first, t, at::TensorOptions().dtype(at::kLong).device(dev)).remainder(w);
  ring.keys_t()[slot].index_copy_(2, cols, stored.narrow(1, first, count).transpose(1, 2));
  ring.values()[slot].index_copy_(1, cols, v.narrow(1, first, count).to(dev, ring.dtype()));
  ring.bias()[slot].index_copy_(1, cols, bias.narrow(1, first, count).to(dev));
}

}  // namespace krause
