#include "model/attention/pair_sums.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <vector>

#include "model/attention/cpu_kernels.h"

namespace krause::internal {

namespace {
// float32 for reduced-precision inputs (as a matrix product accumulates them), else their own type.
at::ScalarType AccumulationType(const at::Tensor& x) {
  return at::promote_types(x.scalar_type(), at::kFloat);
}
}  // namespace

at::Tensor OrderedDots(const at::Tensor& q, const at::Tensor& kt) {
  const at::ScalarType acc = AccumulationType(q);
  const at::Tensor qa = q.to(acc), ka = kt.to(acc);
  at::Tensor dots;
  for (int64_t t = 0; t < q.size(-1); ++t) {
    // [..., R, 1] * [..., 1, C]: one rounding per product, then one per sum, in t order.
    const at::Tensor product = qa.narrow(-1, t, 1) * ka.narrow(-2, t, 1);
    dots = t == 0 ? product : dots + product;
  }
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
