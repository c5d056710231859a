// Causal softmax attention (causal_softmax.h): the reference and the fused CPU training path as one
// autograd function. The kernels (cpu_kernels.inc) take one (batch, head) slice each; the
// backward of a slice writes only that slice's gradients, so slices run in parallel.
#include "model/attention/causal_softmax.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "model/util/threads.h"

namespace krause {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor ReferenceCausalSoftmax(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t t = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const at::Tensor future =
      at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
  const at::Tensor s = (at::matmul(q, k.transpose(-1, -2)) * scale).masked_fill(future, -INFINITY);
  return at::matmul(at::softmax(s, -1), v);
}

// x [B, H, N, d] -> [B, H, d, stride] zero-padded beyond N (the kernels read whole chunks).
at::Tensor TransposedPadded(const at::Tensor& x, int64_t stride) {
  at::Tensor t = at::zeros({x.size(0), x.size(1), x.size(3), stride}, x.options());
  t.narrow(3, 0, x.size(2)).copy_(x.transpose(2, 3));
  return t;
}

struct Slices {
  int64_t b, h, n, d, stride;
  float scale;
};

Slices SlicesOf(const at::Tensor& q) {
  Slices s;
  s.b = q.size(0);
  s.h = q.size(1);
  s.n = q.size(2);
  s.d = q.size(3);
  s.stride = cpu::RoundUpToChunk(s.n);
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)));
  return s;
}

// Slice s of the forward's tensors (what the forward and the backward kernels both read).
cpu::SoftmaxSlice SliceAt(const Slices& sl, int64_t s, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& kt, const at::Tensor& v, const at::Tensor& out,
                          const at::Tensor& lse) {
  const int64_t nd = sl.n * sl.d;
  cpu::SoftmaxSlice x{};
  x.q = q.data_ptr<float>() + s * nd;
  x.k = k.data_ptr<float>() + s * nd;
  x.kt = kt.data_ptr<float>() + s * sl.d * sl.stride;
  x.v = v.data_ptr<float>() + s * nd;
  x.scale = sl.scale;
  x.n = sl.n;
  x.d = sl.d;
  x.stride = sl.stride;
  x.out = out.data_ptr<float>() + s * nd;
  x.lse = lse.data_ptr<float>() + s * sl.n;
  return x;
}

struct FusedCausalSoftmaxFunction : public torch::autograd::Function<FusedCausalSoftmaxFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in) {
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const Slices sl = SlicesOf(q);
    const at::Tensor kt = TransposedPadded(k, sl.stride);
    at::Tensor out = at::empty_like(q);
    at::Tensor lse = at::empty({sl.b, sl.h, sl.n}, q.options());
    const cpu::CpuKernelTable& kern = cpu::CpuKernels();
    const int64_t nd = sl.n * sl.d;
    // Per query, about (i + 1) * 2 d multiply-adds; work items are whole slices.
    at::parallel_for(0, sl.b * sl.h, GrainForWork(1.0 * sl.n * nd), [&](int64_t s0, int64_t s1) {
      std::vector<float> scratch(cpu::SoftmaxScratchFloats(sl.n));
      for (int64_t s = s0; s < s1; ++s) {
        const cpu::SoftmaxSlice x = SliceAt(sl, s, q, k, kt, v, out, lse);
        kern.softmax_forward(x, 0, sl.n, scratch.data());
      }
    });
    ctx->save_for_backward({q, k, v, kt, out, lse});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &kt = saved[3], &out = saved[4],
                     &lse = saved[5];
    const Slices sl = SlicesOf(q);
    at::Tensor g = grads[0];
    if (!g.defined()) g = at::zeros_like(q);
    g = g.contiguous();
    const at::Tensor vt = TransposedPadded(v, sl.stride);
    at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    const cpu::CpuKernelTable& kern = cpu::CpuKernels();
    const int64_t nd = sl.n * sl.d;
    // Per query, about (i + 1) * 5 d multiply-adds.
    at::parallel_for(0, sl.b * sl.h, GrainForWork(2.5 * sl.n * nd), [&](int64_t s0, int64_t s1) {
      std::vector<float> scratch(cpu::SoftmaxScratchFloats(sl.n));
      for (int64_t s = s0; s < s1; ++s) {
        cpu::SoftmaxSlice x = SliceAt(sl, s, q, k, kt, v, out, lse);
        x.vt = vt.data_ptr<float>() + s * sl.d * sl.stride;
        x.g = g.data_ptr<float>() + s * nd;
        x.dq = dq.data_ptr<float>() + s * nd;
        x.dk = dk.data_ptr<float>() + s * nd;
        x.dv = dv.data_ptr<float>() + s * nd;
        kern.softmax_backward(x, scratch.data());
      }
    });
    return {dq, dk, dv};
  }
};

absl::Status Validate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const std::pair<const char*, const at::Tensor*> args[] = {{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : args) {
    if (!t->defined() || t->dim() != 4)
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be [B, H, N, d], got rank ", t->defined() ? t->dim() : 0));
    if (t->sizes() != q.sizes())
      return absl::InvalidArgumentError(
          absl::StrCat(name, " has shape ", c10::str(t->sizes()), ", q has ", c10::str(q.sizes())));
    if (t->scalar_type() != q.scalar_type() || t->device() != q.device())
      return absl::InvalidArgumentError(absl::StrCat(name, " must have q's dtype and device (",
                                                     c10::str(q.scalar_type()), ", ",
                                                     q.device().str(), ")"));
  }
  if (q.size(2) == 0 || q.size(3) == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("q must have N >= 1 and d >= 1, got ", c10::str(q.sizes())));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SoftmaxRoute> ChooseSoftmaxRoute(KrauseImpl impl, bool cpu_fp32, bool recording) {
  switch (impl) {
    case KrauseImpl::kReference:
    case KrauseImpl::kWindowed:
    case KrauseImpl::kCuda:
      return SoftmaxRoute::kReference;
    case KrauseImpl::kFusedCpu:
    case KrauseImpl::kFusedCpuTrain:
      if (!cpu_fp32)
        return absl::InvalidArgumentError(absl::StrCat(
            "impl ", KrauseImplName(impl), " (causal softmax) takes fp32 CPU tensors only"));
      return SoftmaxRoute::kFusedCpu;
    case KrauseImpl::kAuto:
      return cpu_fp32 && recording ? SoftmaxRoute::kFusedCpu : SoftmaxRoute::kReference;
  }
  return absl::InvalidArgumentError("unknown impl");
}

absl::StatusOr<at::Tensor> CausalSoftmaxAttention(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, KrauseImpl impl) {
  try {
    if (absl::Status st = Validate(q, k, v); !st.ok()) return st;
    const bool cpu_fp32 = q.device().is_cpu() && q.scalar_type() == at::kFloat;
    const bool recording =
        at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
    absl::StatusOr<SoftmaxRoute> route = ChooseSoftmaxRoute(impl, cpu_fp32, recording);
    if (!route.ok()) return route.status();
    if (*route == SoftmaxRoute::kReference) return ReferenceCausalSoftmax(q, k, v);
    return FusedCausalSoftmaxFunction::apply(q, k, v);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("causal softmax attention: ", e.what_without_backtrace()));
  }
}

}  // namespace krause
