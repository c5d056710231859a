#include "model/attention/pair_sums.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "model/attention/cpu_kernels.h"

namespace krause::internal {

namespace {
// float32 for reduced-precision inputs (as a matrix product accumulates them), else their own type.
at::ScalarType AccumulationType(const at::Tensor& x) {
  return at::promote_types(x.scalar_type(), at::kFloat);
}

// One row of OrderedDots on the CPU: out[j] = sum over t of q[t] * kt[t][j], in t order, each
// product and each sum rounded on its own (this file is compiled with -ffp-contract=off: no fused
// multiply-add), so the bits equal the elementwise ops' below; the compiler vectorises over j,
// which leaves every element's arithmetic as it is.
template <typename T>
void DotsRow(const T* __restrict q, const T* __restrict kt, int64_t d, int64_t c,
             T* __restrict out) {
  for (int64_t j = 0; j < c; ++j) out[j] = q[0] * kt[j];
  for (int64_t t = 1; t < d; ++t) {
    const T qt = q[t];
    const T* __restrict row = kt + t * c;
    for (int64_t j = 0; j < c; ++j) out[j] = out[j] + qt * row[j];
  }
}

template <typename T>
at::Tensor OrderedDotsCpu(const at::Tensor& qa, const at::Tensor& ka) {
  const int64_t r = qa.size(-2), d = qa.size(-1), c = ka.size(-1);
  // The broadcast leading dims, then both operands dense: q [L, R, d], kt [L, d, C].
  const auto inferred =
      at::infer_size(qa.sizes().slice(0, qa.dim() - 2), ka.sizes().slice(0, ka.dim() - 2));
  const std::vector<int64_t> lead(inferred.begin(), inferred.end());
  auto shaped = [&](const at::Tensor& x, int64_t a, int64_t b) {
    std::vector<int64_t> full = lead;
    full.push_back(a);
    full.push_back(b);
    return x.expand(full).contiguous();
  };
  const at::Tensor qc = shaped(qa, r, d), kc = shaped(ka, d, c);
  std::vector<int64_t> out_shape = lead;
  out_shape.push_back(r);
  out_shape.push_back(c);
  at::Tensor out = at::empty(out_shape, qa.options());
  const int64_t rows = out.numel() / std::max<int64_t>(c, 1);
  if (rows == 0 || c == 0) return out;
  const T* qp = qc.data_ptr<T>();
  const T* kp = kc.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, c * d));
  at::parallel_for(0, rows, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      DotsRow<T>(qp + i * d, kp + (i / r) * d * c, d, c, op + i * c);
  });
  return out;
}

// The forward. On the CPU (fp32, fp64) the loop above; elsewhere, per t, the products of one
// column of q and one row of kt in a scratch tensor, added in place to the sums: the same
// arithmetic in LibTorch's elementwise ops (two passes over [..., R, C] per t). No graph.
at::Tensor OrderedDotsForward(const at::Tensor& qa, const at::Tensor& ka) {
  at::NoGradGuard no_grad;
  if (qa.device().is_cpu() && qa.scalar_type() == at::kFloat) return OrderedDotsCpu<float>(qa, ka);
  if (qa.device().is_cpu() && qa.scalar_type() == at::kDouble) {
    return OrderedDotsCpu<double>(qa, ka);
  }
  return OrderedDotsElementwise(qa, ka);
}

// Differentiable: the forward's sums are the exact per-pair ones above; the backward, which no
// selection reads, takes its two products from matmul (d dots / d q = g kt^T, d / d kt = q^T g),
// summed over the dimensions that were broadcast.
struct OrderedDotsFunction : public torch::autograd::Function<OrderedDotsFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qa,
                            const at::Tensor& ka) {
    ctx->save_for_backward({qa, ka});
    return OrderedDotsForward(qa, ka);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& qa = saved[0];
    const at::Tensor& ka = saved[1];
    const at::Tensor& g = grads[0];
    at::Tensor gq, gk;
    if (ctx->needs_input_grad(0)) gq = at::sum_to(at::matmul(g, ka.transpose(-1, -2)), qa.sizes());
    if (ctx->needs_input_grad(1)) gk = at::sum_to(at::matmul(qa.transpose(-1, -2), g), ka.sizes());
    return {gq, gk};
  }
};

}  // namespace

at::Tensor OrderedDotsElementwise(const at::Tensor& qa, const at::Tensor& ka) {
  at::NoGradGuard no_grad;
  const int64_t d = qa.size(-1);
  at::Tensor dots = qa.narrow(-1, 0, 1) * ka.narrow(-2, 0, 1);  // [..., R, C]
  at::Tensor product = d > 1 ? at::empty_like(dots) : at::Tensor();
  for (int64_t t = 1; t < d; ++t) {
    at::mul_out(product, qa.narrow(-1, t, 1), ka.narrow(-2, t, 1));
    dots.add_(product);
  }
  return dots;
}

at::Tensor OrderedDots(const at::Tensor& q, const at::Tensor& kt) {
  const at::ScalarType acc = AccumulationType(q);
  const at::Tensor qa = q.to(acc), ka = kt.to(acc);
  const bool grad = at::GradMode::is_enabled() && (qa.requires_grad() || ka.requires_grad());
  const at::Tensor dots = grad ? OrderedDotsFunction::apply(qa, ka) : OrderedDotsForward(qa, ka);
  return dots.to(q.scalar_type());
}

at::Tensor OrderedSum(const at::Tensor& x) {
  const at::Tensor xa = x.to(AccumulationType(x));
  at::Tensor sum;
  for (int64_t t = 0; t < x.size(-1); ++t) sum = t == 0 ? xa.select(-1, t) : sum + xa.select(-1, t);
  return sum.to(x.scalar_type());
}

at::Tensor StoredKeyBiases(const at::Tensor& stored) {
  at::NoGradGuard no_grad;
  const at::Tensor kf = stored.to(at::kFloat);
  if (!kf.device().is_cpu()) return -0.5 * OrderedSum(kf * kf);
  const int64_t d = kf.size(-1);
  const at::Tensor rows = kf.reshape({-1, d}).contiguous();
  at::Tensor bias = at::empty({rows.size(0)}, kf.options());
  cpu::CpuKernels().key_biases(rows.data_ptr<float>(), rows.size(0), d, bias.data_ptr<float>());
  std::vector<int64_t> shape = kf.sizes().vec();
  shape.pop_back();
  return bias.view(shape);
}

}  // namespace krause::internal
