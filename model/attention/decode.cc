#include "model/attention/decode.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "model/attention/cpu_scratch.h"
#include "model/attention/pair_sums.h"
#include "model/util/huge_pages.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"
#include "model/util/threads.h"

namespace krause {

absl::StatusOr<KrauseRingCache> KrauseRingCache::Create(int64_t slots, int64_t heads,
                                                        int64_t head_dim, int64_t window,
                                                        const at::Device& device,
                                                        at::ScalarType dtype) {
  if (slots < 1) return absl::InvalidArgumentError(absl::StrCat("slots must be >= 1, got ", slots));
  if (heads < 1) return absl::InvalidArgumentError(absl::StrCat("heads must be >= 1, got ", heads));
  if (head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim must be >= 1, got ", head_dim));
  }
  if (window < 1) {
    return absl::InvalidArgumentError(absl::StrCat("window must be >= 1, got ", window));
  }
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring cache dtype must be float32, bfloat16 or float16, got ", c10::toString(dtype)));
  }
  if (dtype == at::kHalf && !device.is_cuda()) {
    return absl::InvalidArgumentError(
        "a Half ring cache needs a CUDA device (the CPU decode kernel reads float32 or bfloat16)");
  }
  if (dtype != at::kFloat && device.is_cuda() && window > 256) {  // cuda::kWarpRow (krause_cuda.h)
    return absl::InvalidArgumentError(
        absl::StrCat("a ", c10::toString(dtype), " ring cache needs window <= 256, got ", window));
  }
  // cuda::kMaxCandidates and cuda::kMaxHeadDim (krause_cuda.h): the CUDA decode step's limits.
  if (device.is_cuda() && (window > 2048 || head_dim > 256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ring cache on a GPU needs window <= 2048 and head_dim <= 256, got window ",
                     window, ", head_dim ", head_dim));
  }
  KrauseRingCache c;
  c.slots_ = slots;
  c.heads_ = heads;
  c.head_dim_ = head_dim;
  c.window_ = window;
  c.ring_stride_ = cpu::RoundUpToChunk(window);
  try {
    const auto opts = at::TensorOptions().dtype(dtype).device(device);
    c.keys_t_ = ZerosOnHugePages({slots, heads, head_dim, c.ring_stride_}, opts);
    c.values_ = ZerosOnHugePages({slots, heads, window, head_dim}, opts);
    c.bias_ = ZerosOnHugePages({slots, heads, c.ring_stride_}, opts.dtype(at::kFloat));
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the ring cache: ", ExceptionMessage(e)));
  }
  c.keys_base_ = static_cast<char*>(c.keys_t_.data_ptr());
  c.values_base_ = static_cast<char*>(c.values_.data_ptr());
  c.bias_base_ = c.bias_.data_ptr<float>();
  c.elem_bytes_ = static_cast<int64_t>(c.values_.element_size());  // 4, or 2 (bf16, fp16)
  c.elem_ = dtype == at::kBFloat16 ? cpu::Elem::kBFloat16 : cpu::Elem::kFloat32;
  return c;
}

at::Tensor KrauseRingCache::Rounded(const at::Tensor& x, at::ScalarType dtype) {
  if (dtype == at::kHalf) return x.clamp(-65504.0, 65504.0).to(dtype);  // clamp keeps NaN
  return x.to(dtype);
}

int64_t KrauseRingCache::BytesPerSlot(int64_t heads, int64_t head_dim, int64_t window,
                                      at::ScalarType dtype) {
  const int64_t stride = cpu::RoundUpToChunk(window);
  return heads *
         ((head_dim * stride + window * head_dim) * static_cast<int64_t>(c10::elementSize(dtype)) +
          stride * static_cast<int64_t>(sizeof(float)));
}

int64_t KrauseRingCache::bytes_per_slot() const {
  if (!values_.defined()) return 0;
  return BytesPerSlot(heads_, head_dim_, window_, dtype());
}

cpu::DecodeItem KrauseRingCache::HostItem(int64_t slot, int64_t head) {
  const int64_t ring = slot * heads_ + head;
  cpu::DecodeItem item{};
  item.ring_kt = keys_base_ + ring * head_dim_ * ring_stride_ * elem_bytes_;
  item.ring_v = values_base_ + ring * window_ * head_dim_ * elem_bytes_;
  item.elem = elem_;
  item.ring_bias = bias_base_ + ring * ring_stride_;
  item.window = window_;
  item.ring_stride = ring_stride_;
  item.d = head_dim_;
  return item;
}

void KrauseRingCache::SetNext(int64_t slot, int64_t head, cpu::DecodeItem* item) {
  const cpu::DecodeItem next = HostItem(slot, head);
  item->next_kt = next.ring_kt;
  item->next_v = next.ring_v;
  item->next_bias = next.ring_bias;
}

namespace {

absl::Status CheckStepTensor(const at::Tensor& t, const char* name, int64_t s, int64_t h, int64_t d,
                             const at::Device& device) {
  RETURN_IF_ERROR(CheckDefined(t, name));
  if (t.dim() != 3 || t.size(0) != s || t.size(1) != h || t.size(2) != d) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must have shape [S, H, d] = [", s, ", ",
                                                   h, ", ", d, "], got ", ShapeString(t.sizes())));
  }
  if (t.scalar_type() != at::kFloat || t.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be fp32 on ", device.str(), " (the cache's device)"));
  }
  return absl::OkStatus();
}

absl::Status CheckIndexVector(const at::Tensor& t, const char* name, int64_t s) {
  RETURN_IF_ERROR(CheckDefined(t, name));
  if (t.dim() != 1 || t.size(0) != s || t.scalar_type() != at::kLong || !t.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be an int64 CPU tensor of shape [S] = [", s, "], got ",
                     c10::toString(t.scalar_type()), " ", ShapeString(t.sizes())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDecodeStepArgs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const DecodeIndex& index, int64_t heads, int64_t head_dim,
                                 int64_t cache_slots, const at::Device& device) {
  RETURN_IF_ERROR(CheckDefined(q, "q"));
  if (q.dim() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("q must have shape [S, H, d], got ", ShapeString(q.sizes())));
  }
  const int64_t s = q.size(0);
  RETURN_IF_ERROR(CheckStepTensor(q, "q", s, heads, head_dim, device));
  RETURN_IF_ERROR(CheckStepTensor(k, "k", s, heads, head_dim, device));
  RETURN_IF_ERROR(CheckStepTensor(v, "v", s, heads, head_dim, device));
  if (index.size() != s) {
    return absl::InvalidArgumentError(absl::StrCat("slots and positions must have shape [S] = [", s,
                                                   "] (q's S), got [", index.size(), "]"));
  }
  if (index.cache_slots() != cache_slots || index.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index was made for a cache of ", index.cache_slots(), " slots on ", index.device().str(),
        ", not this one (", cache_slots, " slots on ", device.str(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DecodeIndex> DecodeIndex::Create(const at::Tensor& slots,
                                                const at::Tensor& positions, int64_t cache_slots,
                                                const at::Device& device) {
  try {
    RETURN_IF_ERROR(CheckDefined(slots, "slots"));
    if (slots.dim() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slots must be an int64 CPU tensor of shape [S], got ", ShapeString(slots.sizes())));
    }
    const int64_t s = slots.size(0);
    RETURN_IF_ERROR(CheckIndexVector(slots, "slots", s));
    RETURN_IF_ERROR(CheckIndexVector(positions, "positions", s));
    DecodeIndex index;
    index.size_ = s;
    index.cache_slots_ = cache_slots;
    index.device_ = device;
    index.host_slots_ = slots.contiguous();
    index.host_positions_ = positions.contiguous();
    const int64_t* sp = index.host_slots_.data_ptr<int64_t>();
    const int64_t* pp = index.host_positions_.data_ptr<int64_t>();
    std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(cache_slots, 0)), false);
    for (int64_t i = 0; i < s; ++i) {
      if (sp[i] < 0 || sp[i] >= cache_slots) {
        return absl::InvalidArgumentError(
            absl::StrCat("slots[", i, "] = ", sp[i], " is outside [0, ", cache_slots, ")"));
      }
      if (seen[sp[i]]) {
        return absl::InvalidArgumentError(
            absl::StrCat("slots[", i, "] = ", sp[i], " appears twice in one step"));
      }
      seen[sp[i]] = true;
      if (pp[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("positions[", i, "] = ", pp[i], " must be >= 0"));
      }
    }
    if (device.is_cpu()) {
      index.device_slots_ = index.host_slots_;
      index.device_positions_ = index.host_positions_;
    } else {
      index.device_slots_ = index.host_slots_.to(device, /*non_blocking=*/true);
      index.device_positions_ = index.host_positions_.to(device, /*non_blocking=*/true);
      // "cuda" names the current GPU; the copies say which (cuda:0), as the caches' tensors do.
      index.device_ = index.device_slots_.device();
    }
    return index;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("decode index: ", ExceptionMessage(e)));
  }
}

absl::StatusOr<DecodeIndex> DecodeIndex::Adopt(const at::Tensor& slots, const at::Tensor& positions,
                                               int64_t cache_slots, const at::Tensor& device_slots,
                                               const at::Tensor& device_positions) {
  RETURN_IF_ERROR(CheckDefined(device_slots, "device_slots"));
  RETURN_IF_ERROR(CheckDefined(device_positions, "device_positions"));
  const at::Device device = device_slots.device();
  // Validates the host values (on a CPU device this also sets the device copies to them).
  ASSIGN_OR_RETURN(DecodeIndex index, Create(slots, positions, cache_slots, at::Device(at::kCPU)));
  for (const auto& [t, name] :
       {std::pair<const at::Tensor&, const char*>{device_slots, "device_slots"},
        {device_positions, "device_positions"}}) {
    if (t.dim() != 1 || t.size(0) != index.size() || t.scalar_type() != at::kLong ||
        t.device() != device || !t.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be a contiguous int64 tensor of shape [S] = [", index.size(),
                       "] on ", device.str(), ", got ", c10::toString(t.scalar_type()), " ",
                       ShapeString(t.sizes()), " on ", t.device().str()));
    }
  }
  index.device_ = device;
  index.device_slots_ = device_slots;
  index.device_positions_ = device_positions;
  return index;
}

absl::StatusOr<DecodeScale> DecodeScale::Create(const at::Tensor& log_sigma, int64_t heads,
                                                const at::Device& device) {
  try {
    RETURN_IF_ERROR(CheckDefined(log_sigma, "log_sigma"));
    ASSIGN_OR_RETURN(
        const at::Tensor log_sig,
        NormalizeLogSigma(log_sigma, heads, at::TensorOptions().dtype(at::kFloat).device(device)));
    at::NoGradGuard no_grad;
    DecodeScale scale;
    scale.inv_var_ = at::exp(-2.0 * log_sig).contiguous();
    return scale;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("decode scale: ", ExceptionMessage(e)));
  }
}

absl::StatusOr<at::Tensor> KrauseDecodeStep(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& log_sigma,
                                            int64_t top_k, const at::Tensor& slots,
                                            const at::Tensor& positions, KrauseRingCache* cache,
                                            DecodeSelection* selection) {
  if (cache == nullptr || !cache->keys_t().defined()) {
    return absl::InvalidArgumentError("cache must be a created KrauseRingCache");
  }
  const at::Device device = cache->keys_t().device();
  ASSIGN_OR_RETURN(const DecodeIndex index,
                   DecodeIndex::Create(slots, positions, cache->slots(), device));
  ASSIGN_OR_RETURN(const DecodeScale scale, DecodeScale::Create(log_sigma, cache->heads(), device));
  return KrauseDecodeStep(q, k, v, scale, top_k, index, cache, selection);
}

namespace {

// What both decode steps (the kernel's and LibTorch's) check of their arguments.
absl::Status CheckKrauseStep(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const DecodeScale& scale, int64_t top_k, const DecodeIndex& index,
                             KrauseRingCache* cache) {
  if (cache == nullptr || !cache->keys_t().defined()) {
    return absl::InvalidArgumentError("cache must be a created KrauseRingCache");
  }
  const int64_t h = cache->heads();
  const at::Device dev = cache->keys_t().device();
  RETURN_IF_ERROR(CheckDecodeStepArgs(q, k, v, index, h, cache->head_dim(), cache->slots(), dev));
  if (top_k < 1) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 1, got ", top_k));
  const at::Tensor& inv_var = scale.inv_var();
  if (!inv_var.defined() || inv_var.numel() != h || inv_var.device() != dev) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale must be a DecodeScale made for H = ", h, " heads on ", dev.str()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<at::Tensor> KrauseDecodeStep(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const DecodeScale& scale,
                                            int64_t top_k, const DecodeIndex& index,
                                            KrauseRingCache* cache, DecodeSelection* selection) {
  try {
    RETURN_IF_ERROR(CheckKrauseStep(q, k, v, scale, top_k, index, cache));
    const int64_t h = cache->heads(), d = cache->head_dim();
    const int64_t win = cache->window();
    const at::Device dev = cache->keys_t().device();
    const int64_t s = q.size(0);
    const at::Tensor& inv_var = scale.inv_var();
    const int64_t* sp = index.host_slots().data_ptr<int64_t>();
    const int64_t* pp = index.host_positions().data_ptr<int64_t>();

    at::NoGradGuard no_grad;
    if (dev.is_cuda()) {
#ifdef KRAUSE_WITH_CUDA
      return internal::CudaDecodeStep(q, k, v, inv_var, top_k, index, cache, selection);
#else
      return absl::InvalidArgumentError("the cache is on CUDA but this build has no CUDA kernels");
#endif
    }
    const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
    at::Tensor out = at::empty({s, h, d}, q.options());
    const int64_t kept = std::min(top_k, win);
    if (selection != nullptr) {
      selection->indices = at::empty({s, h, kept}, q.options().dtype(at::kLong));
      selection->weights = at::empty({s, h, kept}, q.options());
    }
    const cpu::CpuKernelTable& kernels = cpu::CpuKernels();
    const float* qp = qc.data_ptr<float>();
    const float* kp = kc.data_ptr<float>();
    const float* vnp = vc.data_ptr<float>();
    const float* ivp = inv_var.data_ptr<float>();
    float* op = out.data_ptr<float>();
    int64_t* sip = selection ? selection->indices.data_ptr<int64_t>() : nullptr;
    float* swp = selection ? selection->weights.data_ptr<float>() : nullptr;

    at::parallel_for(0, s * h, GrainForWork(4.0 * win * d), [&](int64_t w0, int64_t w1) {
      const cpu::ScratchTensors scratch_tensors(win);
      const cpu::Scratch& scratch = scratch_tensors.view();
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t i = w / h, head = w % h;
        cpu::DecodeItem item = cache->HostItem(sp[i], head);
        item.q = qp + w * d;
        item.k = kp + w * d;
        item.v = vnp + w * d;
        item.position = pp[i];
        item.top_k = top_k;
        item.inv_var = ivp[head];
        item.out = op + w * d;
        item.sel_index = sip ? sip + w * kept : nullptr;
        item.sel_weight = swp ? swp + w * kept : nullptr;
        if (w + 1 < w1) cache->SetNext(sp[(w + 1) / h], (w + 1) % h, &item);
        kernels.decode(item, scratch);
      }
    });
    return out;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("krause decode step failed: ", ExceptionMessage(e)));
  }
}

}  // namespace krause

namespace krause {

absl::StatusOr<at::Tensor> KrauseDecodeStepLibTorch(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const DecodeScale& scale,
                                                    int64_t top_k, const DecodeIndex& index,
                                                    KrauseRingCache* cache) {
  try {
    RETURN_IF_ERROR(CheckKrauseStep(q, k, v, scale, top_k, index, cache));
    const int64_t h = cache->heads(), d = cache->head_dim(), win = cache->window();
    const at::Tensor& inv_var = scale.inv_var();
    using at::indexing::Slice;
    at::NoGradGuard no_grad;
    const int64_t s = q.size(0);
    const at::Tensor& slots = index.device_slots();
    const at::Tensor& pos = index.device_positions();  // [S]
    // Append: position p goes to ring column p % W, its key rounded as the ring stores it and
    // its bias that of the stored key.
    const at::Tensor col = pos.remainder(win);
    const at::Tensor kr = KrauseRingCache::Rounded(k, cache->dtype());
    at::Tensor keys_t = cache->keys_t(), values_t = cache->values(), bias_t = cache->bias();
    keys_t.index_put_({slots, Slice(), Slice(), col}, kr);  // [S, H, d] (in place: same storage)
    values_t.index_put_({slots, Slice(), col}, KrauseRingCache::Rounded(v, cache->dtype()));
    bias_t.index_put_({slots, Slice(), col}, internal::StoredKeyBiases(kr));  // [S, H]
    // Gather each sequence's ring: keys [S, H, d, W], values [S, H, W, d], biases [S, H, W].
    const at::Tensor keys = cache->keys_t().index_select(0, slots).narrow(3, 0, win).to(at::kFloat);
    const at::Tensor values = cache->values().index_select(0, slots).to(at::kFloat);
    const at::Tensor bias = cache->bias().index_select(0, slots).narrow(2, 0, win);
    // Scores in the bias form, (q . k_j + b_j) / sigma^2: [S, H, W], each a function of its
    // (query, key) pair alone (internal::OrderedDots), so that equal keys tie exactly.
    at::Tensor scores = (internal::OrderedDots(q.unsqueeze(2), keys).squeeze(2) + bias) *
                        inv_var.view({1, h, 1});
    // Column c holds position p - ((p - c) mod W); columns of positions < 0 hold nothing yet.
    const at::Tensor cols = at::arange(win, pos.options()).view({1, win});
    const at::Tensor held = pos.view({s, 1}) - (pos.view({s, 1}) - cols).remainder(win);  // [S, W]
    scores = scores.masked_fill((held < 0).unsqueeze(1), -INFINITY);
    // The tie rule: the larger position first. Columns in descending position order, then a
    // stable descending sort by score keeps that order among equal scores.
    const at::Tensor by_position = std::get<1>(held.sort(/*dim=*/1, /*descending=*/true));
    const at::Tensor order = by_position.unsqueeze(1).expand({s, h, win});
    const auto [sorted, rank] =
        scores.gather(2, order).sort(/*stable=*/true, /*dim=*/2, /*descending=*/true);
    const int64_t kept = std::min(top_k, win);
    const at::Tensor kept_cols = order.gather(2, rank.narrow(2, 0, kept));  // [S, H, K]
    const at::Tensor weights = at::softmax(sorted.narrow(2, 0, kept), -1);  // -inf: weight 0
    const at::Tensor kept_values =
        values.gather(2, kept_cols.unsqueeze(-1).expand({s, h, kept, d}));  // [S, H, K, d]
    return (weights.unsqueeze(-1) * kept_values).sum(2);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("krause decode step (LibTorch) failed: ", ExceptionMessage(e)));
  }
}

}  // namespace krause
