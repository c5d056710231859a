#include "model/nn/invariant_linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

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
  const cpu::LinearRowsArgs args{
      xc.data_ptr<float>(),  wt_.data_ptr<float>(), bias_.data_ptr<float>(),
      out.data_ptr<float>(), wt_.size(0),           pad};
  const cpu::CpuKernelTable& kernels = cpu::CpuKernels();
  at::parallel_for(
      0, (m + cpu::kQueryGroup - 1) / cpu::kQueryGroup, 1, [&](int64_t b0, int64_t b1) {
        kernels.linear_rows(args, b0 * cpu::kQueryGroup, std::min(m, b1 * cpu::kQueryGroup));
      });
  return pad == out_ ? out : out.narrow(1, 0, out_);
}

}  // namespace krause::nn
