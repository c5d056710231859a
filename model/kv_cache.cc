#include "model/kv_cache.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "model/attention/pair_sums.h"
#include "model/nn/packed.h"
#include "model/util/huge_pages.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {

// ---- KrauseLayerCache

absl::StatusOr<std::unique_ptr<KrauseLayerCache>> KrauseLayerCache::Create(
    int64_t slots, int64_t heads, int64_t head_dim, int64_t window, int64_t top_k,
    const at::Device& device, at::ScalarType dtype) {
  if (top_k < 1) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 1, got ", top_k));
  auto ring = KrauseRingCache::Create(slots, heads, head_dim, window, device, dtype);
  if (!ring.ok()) return ring.status();
  return std::unique_ptr<KrauseLayerCache>(new KrauseLayerCache(std::move(ring).value(), top_k));
}

void KrauseLayerCache::WritePrefix(int64_t slot, const at::Tensor& k, const at::Tensor& v) {
  at::NoGradGuard no_grad;
  const int64_t t = k.size(1);
  const int64_t w = ring_.window();
  // The keys as the ring holds them (a bf16 / fp16 cache rounds them); the biases are theirs.
  const at::Tensor stored = KrauseRingCache::Rounded(k.to(device_), ring_.dtype()).contiguous();
  const at::Tensor bias = internal::StoredKeyBiases(stored);  // [H, T], as the steps compute it
  // The last min(T, W) positions p go to ring column p % W: one index_copy_ per tensor.
  const int64_t first = std::max<int64_t>(0, t - w), count = t - first;
  const at::Tensor cols =
      at::arange(first, t, at::TensorOptions().dtype(at::kLong).device(device_)).remainder(w);
  ring_.keys_t()[slot].index_copy_(2, cols, stored.narrow(1, first, count).transpose(1, 2));
  ring_.values()[slot].index_copy_(
      1, cols, KrauseRingCache::Rounded(v.narrow(1, first, count).to(device_), ring_.dtype()));
  ring_.bias()[slot].index_copy_(1, cols, bias.narrow(1, first, count).to(device_));
}

absl::StatusOr<at::Tensor> KrauseLayerCache::Attend(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const DecodeIndex& index,
                                                    const DecodeScale* scale) {
  if (scale == nullptr) {
    return absl::InvalidArgumentError("a Krause layer cache needs the layer's DecodeScale");
  }
  if (libtorch_decode_) return KrauseDecodeStepLibTorch(q, k, v, *scale, top_k_, index, &ring_);
  return KrauseDecodeStep(q, k, v, *scale, top_k_, index, &ring_);
}

namespace {
absl::Status CheckDecodeImpl(KrauseImpl impl) {
  if (impl == KrauseImpl::kAuto || impl == KrauseImpl::kWindowed) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("a cache decodes with auto or windowed, not ", KrauseImplName(impl)));
}
}  // namespace

absl::Status KrauseLayerCache::SetDecodeImpl(KrauseImpl impl) {
  RETURN_IF_ERROR(CheckDecodeImpl(impl));
  libtorch_decode_ = impl == KrauseImpl::kWindowed;
  return absl::OkStatus();
}

absl::Status SoftmaxLayerCache::SetDecodeImpl(KrauseImpl impl) { return CheckDecodeImpl(impl); }

absl::Status PixelKvCache::SetDecodeImpl(KrauseImpl impl) {
  for (auto& layer : layers_) RETURN_IF_ERROR(layer->SetDecodeImpl(impl));
  return absl::OkStatus();
}

void KrauseLayerCache::AttendRows(const DecodeRow* rows, int64_t n, nn::ThreadScratch& scratch,
                                  bool fetch_next) {
  const cpu::Scratch& kernel_scratch = scratch.Kernel(ring_.window());
  const cpu::CpuKernelTable& kernels = cpu::CpuKernels();
  for (int64_t i = 0; i < n; ++i) {
    const DecodeRow& row = rows[i];
    cpu::DecodeItem item = ring_.HostItem(row.slot, row.head);
    item.q = row.q;
    item.k = row.k;
    item.v = row.v;
    item.position = row.position;
    item.top_k = top_k_;
    item.inv_var = row.inv_var;
    item.out = row.out;
    if (fetch_next && i + 1 < n) ring_.SetNext(rows[i + 1].slot, rows[i + 1].head, &item);
    kernels.decode(item, kernel_scratch);
  }
}

std::vector<at::Tensor> KrauseLayerCache::Storage() {
  return {ring_.keys_t(), ring_.values(), ring_.bias()};
}

// ---- SoftmaxLayerCache

SoftmaxLayerCache::SoftmaxLayerCache(at::Tensor keys, at::Tensor values)
    : keys_(std::move(keys)),
      values_(std::move(values)),
      // The storage's device: "cuda" names the current GPU, the tensors say which (cuda:0), and
      // the decode step's arguments are compared with it (a cache made on "cuda" refused them).
      device_(keys_.device()),
      scale_(1.0 / std::sqrt(static_cast<double>(keys_.size(3)))) {}

absl::StatusOr<std::unique_ptr<SoftmaxLayerCache>> SoftmaxLayerCache::Create(
    int64_t slots, int64_t heads, int64_t head_dim, int64_t seq_len, const at::Device& device) {
  if (slots < 1 || heads < 1 || head_dim < 1 || seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slots ", slots, ", heads ", heads,
                                                   ", head_dim ", head_dim, " and seq_len ",
                                                   seq_len, " must be >= 1"));
  }
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  return std::unique_ptr<SoftmaxLayerCache>(
      new SoftmaxLayerCache(ZerosOnHugePages({slots, heads, seq_len, head_dim}, opts),
                            ZerosOnHugePages({slots, heads, seq_len, head_dim}, opts)));
}

void SoftmaxLayerCache::WritePrefix(int64_t slot, const at::Tensor& k, const at::Tensor& v) {
  at::NoGradGuard no_grad;
  const int64_t t = k.size(1);
  keys_[slot].narrow(1, 0, t).copy_(k);
  values_[slot].narrow(1, 0, t).copy_(v);
}

absl::StatusOr<at::Tensor> SoftmaxLayerCache::Attend(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const DecodeIndex& index,
                                                     const DecodeScale* /*scale*/) {
  RETURN_IF_ERROR(CheckDecodeStepArgs(q, k, v, index, heads(), head_dim(), slots(), device_));
  const int64_t s = index.size();
  const auto pos = index.host_positions().accessor<int64_t, 1>();
  int64_t longest = 0;
  for (int64_t i = 0; i < s; ++i) {
    if (pos[i] >= length()) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions[", i, "] = ", pos[i], " is outside [0, ", length(), ")"));
    }
    longest = std::max(longest, pos[i] + 1);
  }
  try {
    at::NoGradGuard no_grad;
    using at::indexing::Slice;
    const at::Tensor& slots_d = index.device_slots();
    const at::Tensor& pos_d = index.device_positions();
    // later: [S, 1, 1, L], true beyond each sequence's own position.
    const at::Tensor later =
        at::arange(longest, pos_d.options()).view({1, 1, 1, longest}) > pos_d.view({s, 1, 1, 1});
    keys_.index_put_({slots_d, Slice(), pos_d}, k);
    values_.index_put_({slots_d, Slice(), pos_d}, v);
    // Only positions 0..longest-1 of the batch's slots are gathered (not the whole length).
    const at::Tensor kp = keys_.narrow(2, 0, longest).index_select(0, slots_d);
    const at::Tensor vp = values_.narrow(2, 0, longest).index_select(0, slots_d);
    const at::Tensor w = at::softmax(
        (at::matmul(q.unsqueeze(2), kp.transpose(2, 3)) * scale_).masked_fill(later, -INFINITY),
        -1);                              // [S, H, 1, L]
    return at::matmul(w, vp).squeeze(2);  // [S, H, d]
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("softmax decode step failed: ", ExceptionMessage(e)));
  }
}

void SoftmaxLayerCache::AttendRows(const DecodeRow* rows, int64_t n, nn::ThreadScratch& scratch,
                                   bool /*fetch_next*/) {
  for (int64_t i = 0; i < n; ++i) AttendOne(rows[i], scratch);
}

void SoftmaxLayerCache::AttendOne(const DecodeRow& row, nn::ThreadScratch& scratch) {
  // Softmax over the whole prefix 0..p, in position order.
  const int64_t dh = head_dim(), n = length(), p = row.position;
  const int64_t base = ((row.slot * heads() + row.head) * n) * dh;
  float* keys = keys_.data_ptr<float>() + base;
  float* values = values_.data_ptr<float>() + base;
  std::copy(row.k, row.k + dh, keys + p * dh);
  std::copy(row.v, row.v + dh, values + p * dh);
  const float scale = static_cast<float>(scale_);
  float* score = scratch.Floats(n);
  float row_max = -INFINITY;
  for (int64_t j = 0; j <= p; ++j) {
    score[j] = nn::Dot(row.q, keys + j * dh, dh) * scale;
    row_max = std::max(row_max, score[j]);
  }
  float total = 0.0f;
  for (int64_t j = 0; j <= p; ++j) {
    score[j] = std::exp(score[j] - row_max);
    total += score[j];
  }
  float* o = row.out;
  std::fill(o, o + dh, 0.0f);
  for (int64_t j = 0; j <= p; ++j) {
    const float w = score[j];
    const float* vj = values + j * dh;
    for (int64_t t = 0; t < dh; ++t) o[t] += w * vj[t];
  }
  const float inv = 1.0f / total;
  for (int64_t t = 0; t < dh; ++t) o[t] *= inv;
}

// ---- PixelKvCache

absl::StatusOr<PixelKvCache> PixelKvCache::Create(const PixelModelConfig& c, int64_t slots,
                                                  const at::Device& device, at::ScalarType dtype) {
  if (slots < 1)
    return absl::InvalidArgumentError(absl::StrCat("cache slots must be >= 1, got ", slots));
  const bool krause = c.attention == AttentionKind::kKrause;
  if (!krause && dtype != at::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ARM's KV cache is float32; ", c10::toString(dtype), " caches are for KARM rings"));
  }
  PixelKvCache cache;
  cache.kind_ = c.attention;
  cache.slots_ = slots;
  const int64_t dh = c.d_model / c.heads;
  try {
    for (int64_t l = 0; l < c.depth; ++l) {
      if (krause) {
        auto layer = KrauseLayerCache::Create(slots, c.heads, dh, c.window, c.top_k, device, dtype);
        if (!layer.ok()) return layer.status();
        cache.layers_.push_back(std::move(layer).value());
      } else {
        auto layer = SoftmaxLayerCache::Create(slots, c.heads, dh, c.seq_len(), device);
        if (!layer.ok()) return layer.status();
        cache.layers_.push_back(std::move(layer).value());
      }
    }
    if (c.classes > 0) {
      cache.class_host_.assign(slots, c.null_class());
      cache.class_device_ =
          at::full({slots}, c.null_class(), at::TensorOptions().dtype(at::kLong).device(device));
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the KV cache: ", ExceptionMessage(e)));
  }
  return cache;
}

int64_t PixelKvCache::BytesPerSequence(const PixelModelConfig& c, at::ScalarType dtype) {
  const int64_t dh = c.d_model / c.heads;
  if (c.attention == AttentionKind::kKrause) {
    return c.depth * KrauseRingCache::BytesPerSlot(c.heads, dh, c.window, dtype);
  }
  return c.depth * c.heads * c.seq_len() * dh * 2 * 4;
}

void PixelKvCache::SetClass(int64_t slot, int64_t class_row) {
  class_host_[slot] = class_row;
  class_device_[slot].fill_(class_row);
}

}  // namespace krause
