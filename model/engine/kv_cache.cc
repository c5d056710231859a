#include "model/engine/kv_cache.h"

#include <ATen/ATen.h>

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

absl::StatusOr<ArmKvCache> ArmKvCache::Create(const ArmConfig& c, int64_t slots) {
  if (slots < 1)
    return absl::InvalidArgumentError(absl::StrCat("cache slots must be >= 1, got ", slots));
  ArmKvCache cache;
  cache.slots_ = slots;
  const int64_t dh = c.width / c.heads;
  try {
    for (int64_t l = 0; l < c.depth; ++l) {
      if (c.attention == "krause") {
        auto ring = KrauseRingCache::Create(slots, c.heads, dh, c.window);
        if (!ring.ok()) return ring.status();
        cache.rings_.push_back(std::move(ring).value());
      } else {
        cache.keys_.push_back(at::zeros({slots, c.heads, c.seq_len(), dh}));
        cache.values_.push_back(at::zeros({slots, c.heads, c.seq_len(), dh}));
      }
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the KV cache: ", e.what()));
  }
  return cache;
}

int64_t ArmKvCache::BytesPerSequence(const ArmConfig& c) {
  const int64_t dh = c.width / c.heads;
  if (c.attention == "krause") {
    const int64_t stride = cpu::RoundUpToChunk(c.window);
    return c.depth * c.heads * (dh * stride + c.window * dh + stride) * 4;
  }
  return c.depth * c.heads * c.seq_len() * dh * 2 * 4;
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
  const at::Tensor kc = k.contiguous().to(at::kFloat), vc = v.contiguous().to(at::kFloat);
  // Biases with the decode kernel's own function, so prefill and decode agree bit for bit.
  at::Tensor bias = at::empty({k.size(0), t}, at::kFloat);
  for (int64_t h = 0; h < k.size(0); ++h) {
    cpu::CpuKernels().key_biases(kc[h].data_ptr<float>(), t, d, bias[h].data_ptr<float>());
  }
  for (int64_t p = std::max<int64_t>(0, t - w); p < t; ++p) {
    const int64_t col = p % w;
    ring.keys_t()[slot].select(2, col).copy_(kc.select(1, p));
    ring.values()[slot].select(1, col).copy_(vc.select(1, p));
    ring.bias()[slot].select(1, col).copy_(bias.select(1, p));
  }
}

}  // namespace krause
