// The GPU parity tests' shared parts (attention_cuda_test.cc, attention_cuda_edge_test.cc,
// attention_cuda_decode_test.cc): distinct sigmas per head, one CUDA kernel variant forced for a
// scope, and the variants' names.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/attention/krause_attention.h"

namespace krause::testing {

// Clearly different sigmas per head (ln 0.7, ln 2.5, ln 6 for three heads): a kernel that takes
// head 0's 1/sigma^2 for every head, or indexes it by batch * heads + head (past the [H] array
// for batch > 0) or by the query row, moves the softmax weights far beyond the tolerance.
inline at::Tensor PerHeadLogSigma(int64_t heads, const at::Device& device = at::Device(at::kCPU)) {
  static constexpr double kSigmas[] = {0.7, 2.5, 6.0, 1.2, 4.0, 0.9, 3.2, 1.6};
  std::vector<float> ls;
  for (int64_t h = 0; h < heads; ++h) ls.push_back(static_cast<float>(std::log(kSigmas[h % 8])));
  return at::tensor(ls).to(device);
}

// Forces one CUDA kernel variant for a scope.
class ForceKernel {
 public:
  explicit ForceKernel(internal::CudaKernel k) { internal::SetCudaKernelForTesting(k); }
  ~ForceKernel() { internal::SetCudaKernelForTesting(internal::CudaKernel::kAuto); }
};

inline const char* KernelName(internal::CudaKernel k) {
  switch (k) {
    case internal::CudaKernel::kWarp:
      return "warp";
    case internal::CudaKernel::kBlock:
      return "block";
    default:
      return "auto";
  }
}

}  // namespace krause::testing
