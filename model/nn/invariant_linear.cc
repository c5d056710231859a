#include "model/nn/invariant_linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include "model/attention/cpu_kernels.h"

namespace krause::nn {

PackedLinear::PackedLinear(const ParameterStore& p, const std::string& prefix) {
  at::NoGradGuard no_grad;
  const at::Tensor w = p.Get(prefix + ".weight").detach().to(at::kCPU, at::kFloat);  // [out, in]
  out_ = w.size(0);
  const int64_t pad = cpu::RoundUpToChunk(out_);
  wt_ = at::zeros({w.size(1), pad});
  wt_.narrow(1, 0, out_).copy_(w.t());
  bias_ = at::zeros({pad});
  bias_.narrow(0, 0, out_).copy_(p.Get(prefix + ".bias").detach().to(at::kCPU, at::kFloat));
}

at::Tensor PackedLinear::Apply(const at::Tensor& x) const {
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), pad = wt_.size(1);
  at::Tensor out = at::empty({m, pad});
  const cpu::LinearRowsArgs args{xc.data_ptr<float>(),
                                 wt_.data_ptr<float>(),
                                 bias_.data_ptr<float>(),
                                 out.data_ptr<float>(),
                                 m,
                                 wt_.size(0),
                                 pad};
  const cpu::CpuKernelTable& kernels = cpu::CpuKernels();
  // Parallel over column chunks: one row (a single sequence) still uses every core.
  at::parallel_for(0, pad / cpu::kScoreChunk, 1,
                   [&](int64_t c0, int64_t c1) { kernels.linear_rows(args, c0, c1); });
  return pad == out_ ? out : out.narrow(1, 0, out_);
}

}  // namespace krause::nn
