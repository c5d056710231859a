// krause-attention-gpu-bench: the CUDA Krause prefill against dense causal attention of the
// same shape on one GPU, side by side in one run (CUDA builds only).
//
//   krause-attention-gpu-bench [--json FILE]
//
// Shape of the GPU target: N = 3072, W = 256, k = 192, H = 8, d = 64, B = 1 and 8, fp32; each
// CUDA kernel variant (a thread block per row, a warp per row; kAuto takes the warp one here).
// Dense causal attention is at::scaled_dot_product_attention (LibTorch 2.x) or, on 1.13, the
// masked matmul-softmax-matmul. Times are medians of CUDA-event-timed runs after warm-up.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/attention/krause_attention.h"

namespace {

// Median milliseconds of `runs` launches of f (after 3 warm-up runs).
double MedianMs(const std::function<void()>& f, int runs = 20) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> ms;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const cudaStream_t s = c10::cuda::getCurrentCUDAStream().stream();
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a, s);
    f();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

at::Tensor DenseCausal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
#else
  const int64_t n = q.size(2);
  const at::Tensor mask = at::ones({n, n}, q.options().dtype(at::kBool)).triu(1);
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  s = s.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(s, -1), v);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: krause-attention-gpu-bench [--json FILE]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "krause-attention-gpu-bench: no CUDA device\n");
    return 1;
  }
  at::NoGradGuard no_grad;
  const at::Device dev(at::kCUDA);
  const int64_t n = 3072, w = 256, top_k = 192, h = 8, d = 64;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-4s %-6s %12s %12s %8s\n", "B", "kernel", "krause ms", "dense ms", "ratio");
  for (int64_t b : {1, 8}) {
    at::manual_seed(1);
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(dev);
    const at::Tensor q = at::randn({b, h, n, d}, opts), k = at::randn({b, h, n, d}, opts),
                     v = at::randn({b, h, n, d}, opts);
    const at::Tensor ls = at::full({h}, std::log(2.5f), opts);
    krause::KrauseOptions o;
    o.neighbourhood = krause::Neighbourhood::Causal(w);
    o.top_k = top_k;
    o.impl = krause::KrauseImpl::kCuda;
    const double dms = MedianMs([&] { DenseCausal(q, k, v); });
    for (const auto kernel :
         {krause::internal::CudaKernel::kBlock, krause::internal::CudaKernel::kWarp}) {
      const char* name = kernel == krause::internal::CudaKernel::kWarp ? "warp" : "block";
      krause::internal::SetCudaKernelForTesting(kernel);
      bool ok = true;
      const double kms = MedianMs([&] { ok = ok && krause::KrauseAttention(q, k, v, ls, o).ok(); });
      krause::internal::SetCudaKernelForTesting(krause::internal::CudaKernel::kAuto);
      if (!ok) {
        std::fprintf(stderr, "krause-attention-gpu-bench: kCuda (%s) failed\n", name);
        continue;
      }
      std::printf("%-4lld %-6s %12.3f %12.3f %8.2f\n", static_cast<long long>(b), name, kms, dms,
                  dms / kms);
      rows.push_back({{"batch", b},
                      {"kernel", name},
                      {"n", n},
                      {"window", w},
                      {"top_k", top_k},
                      {"heads", h},
                      {"head_dim", d},
                      {"krause_ms", kms},
                      {"dense_causal_ms", dms},
                      {"dense_over_krause", dms / kms}});
    }
  }
  if (!json_path.empty()) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, 0);
    std::ofstream(json_path)
        << nlohmann::json{{"gpu", p.name}, {"torch", TORCH_VERSION}, {"rows", rows}}.dump(2)
        << "\n";
  }
  return 0;
}
