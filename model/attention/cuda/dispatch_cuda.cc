// kCuda: Krause attention on CUDA tensors through the kernels of krause_cuda.cu. Compiled only
// when KRAUSE_WITH_CUDA (a CUDA-enabled LibTorch); scripts/check-cuda-compile.sh syntax-checks it
// everywhere else.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/attention/cuda/krause_cuda.h"
#include "model/attention/decode.h"
#include "model/attention/krause_attention.h"
#include "model/attention/neighbourhood.h"

namespace krause::internal {
namespace {

std::atomic<CudaKernel> forced_kernel{CudaKernel::kAuto};

// The variant for this call: forced by a test, else KRAUSE_CUDA_KERNEL (read once), else auto.
cuda::Variant KernelVariant() {
  static const CudaKernel from_env = [] {
    const char* e = std::getenv("KRAUSE_CUDA_KERNEL");
    if (e != nullptr && std::strcmp(e, "block") == 0) return CudaKernel::kBlock;
    if (e != nullptr && std::strcmp(e, "warp") == 0) return CudaKernel::kWarp;
    return CudaKernel::kAuto;
  }();
  CudaKernel k = forced_kernel.load();
  if (k == CudaKernel::kAuto) k = from_env;
  switch (k) {
    case CudaKernel::kBlock:
      return cuda::Variant::kBlock;
    case CudaKernel::kWarp:
      return cuda::Variant::kWarp;
    default:
      return cuda::Variant::kAuto;
  }
}

struct DeviceCandidates {
  at::Tensor cand, count;  // int32 [n * width], [n] on the GPU
  int64_t width = 0;
  // Where width > kWarpRow: the rows of more than kWarpRow candidates (int32, ascending), for
  // the block kernel while the warp kernel runs the others.
  at::Tensor wide;
};

// The candidate table of (neighbourhood, N) on a GPU, built on the host and uploaded once and
// kept for the process: a server has one per model and input size, so its prefills do no host
// work or host-to-device copy for it. Up to kMaxKept tables are kept; beyond, they are built per
// call. Thread-safe.
DeviceCandidates CandidatesOn(const Neighbourhood& nb, int64_t n, const at::Device& device) {
  constexpr size_t kMaxKept = 64;
  static std::mutex mu;
  // Never destroyed: GPU tensors must not be freed after the CUDA runtime is torn down at exit.
  static auto* kept = new std::map<std::string, DeviceCandidates>();
  const std::string key = absl::StrCat(nb.ToString(), "/", n, "/", device.index());
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = kept->find(key); it != kept->end()) return it->second;
  }
  // (CudaTakes checked the width before: no table of more than kMaxCandidates per row is built.)
  const CandidateTable table = BuildCandidateTable(nb, n);
  TORCH_CHECK(table.width <= cuda::kMaxCandidates, "cuda: at most ", cuda::kMaxCandidates,
              " candidates per row, got ", table.width);
  const std::vector<int32_t> cand(table.index.begin(), table.index.end());
  const std::vector<int32_t> count(table.count.begin(), table.count.end());
  std::vector<int32_t> wide;
  for (int64_t i = 0; i < n; ++i) {
    if (table.count[i] > cuda::kWarpRow) wide.push_back(static_cast<int32_t>(i));
  }
  DeviceCandidates d;
  d.width = table.width;
  // Synchronous uploads: complete before any stream uses the tensors.
  const auto int32 = at::TensorOptions().dtype(at::kInt);
  d.cand = at::tensor(cand, int32).to(device, false);
  d.count = at::tensor(count, int32).to(device, false);
  if (!wide.empty()) d.wide = at::tensor(wide, int32).to(device, false);
  std::lock_guard<std::mutex> lock(mu);
  if (kept->size() < kMaxKept) kept->emplace(key, d);
  return d;
}

}  // namespace

void SetCudaKernelForTesting(CudaKernel kernel) { forced_kernel.store(kernel); }

absl::Status CudaTakes(const AttentionArgs& a, const KrauseOptions& o) {
  if (a.head_dim > cuda::kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("impl cuda: head dimension at most ",
                                                   cuda::kMaxHeadDim, ", got ", a.head_dim));
  }
  const int64_t width = MaxCandidates(o.neighbourhood, a.n);
  if (width > cuda::kMaxCandidates) {
    return absl::InvalidArgumentError(absl::StrCat("impl cuda: at most ", cuda::kMaxCandidates,
                                                   " candidates per row, got ", width, " (",
                                                   o.neighbourhood.ToString(), ", N ", a.n, ")"));
  }
  return absl::OkStatus();
}

KrauseResult CudaAttention(const AttentionArgs& a, const KrauseOptions& o) {
  const c10::cuda::CUDAGuard guard(a.q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const at::Tensor q = a.q.contiguous(), k = a.k.contiguous(), v = a.v.contiguous();
  const auto f32 = q.options();
  const DeviceCandidates table = CandidatesOn(o.neighbourhood, a.n, q.device());
  const at::Tensor& cand_d = table.cand;
  const at::Tensor& count_d = table.count;
  at::Tensor bias = at::empty({a.batch, a.heads, a.n}, f32);
  C10_CUDA_CHECK(cuda::KeyBias(k.data_ptr<float>(), a.batch * a.heads * a.n, a.head_dim,
                               bias.data_ptr<float>(), stream));
  const at::Tensor inv_sigma2 = at::exp(-2.0 * a.log_sigma.to(f32)).contiguous();

  KrauseResult r;
  r.out = at::empty_like(q);
  cuda::PrefillArgs p;
  p.q = q.data_ptr<float>();
  p.k = k.data_ptr<float>();
  p.v = v.data_ptr<float>();
  p.bias = bias.data_ptr<float>();
  p.inv_sigma2 = inv_sigma2.data_ptr<float>();
  p.cand = cand_d.data_ptr<int32_t>();
  p.count = count_d.data_ptr<int32_t>();
  p.width = table.width;
  p.batch = a.batch;
  p.heads = a.heads;
  p.n = a.n;
  p.d = a.head_dim;
  p.kept = a.kept;
  if (table.wide.defined()) {
    p.wide_rows = table.wide.data_ptr<int32_t>();
    p.n_wide = table.wide.numel();
  }
  p.out = r.out.data_ptr<float>();
  if (o.return_selection) {
    r.indices = at::empty({a.batch, a.heads, a.n, a.kept}, f32.dtype(at::kLong));
    r.weights = at::empty({a.batch, a.heads, a.n, a.kept}, f32);
    p.sel_index = r.indices.data_ptr<int64_t>();
    p.sel_weight = r.weights.data_ptr<float>();
  }
  C10_CUDA_CHECK(cuda::Prefill(p, stream, KernelVariant()));
  return r;
}

at::Tensor CudaDecodeStep(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& inv_var, int64_t top_k, const DecodeIndex& index,
                          KrauseRingCache* cache, DecodeSelection* selection) {
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor& slots_d = index.device_slots();
  const at::Tensor& pos_d = index.device_positions();
  const int64_t s = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t kept = std::min(top_k, cache->window());
  at::Tensor out = at::empty({s, h, d}, q.options());
  cuda::DecodeArgs a;
  a.q = qc.data_ptr<float>();
  a.k = kc.data_ptr<float>();
  a.v = vc.data_ptr<float>();
  a.inv_sigma2 = inv_var.data_ptr<float>();
  a.slots = slots_d.data_ptr<int64_t>();
  a.positions = pos_d.data_ptr<int64_t>();
  a.seqs = s;
  a.heads = h;
  a.d = d;
  a.window = cache->window();
  a.ring_stride = cache->ring_stride();
  a.kept = kept;
  a.keys_t = cache->keys_t().data_ptr();
  a.values = cache->values().data_ptr();
  a.cache = cache->dtype() == at::kBFloat16 ? cuda::CacheType::kBFloat16
            : cache->dtype() == at::kHalf   ? cuda::CacheType::kFloat16
                                            : cuda::CacheType::kFloat32;
  a.ring_bias = cache->bias().data_ptr<float>();
  a.out = out.data_ptr<float>();
  if (selection != nullptr) {
    selection->indices = at::empty({s, h, kept}, q.options().dtype(at::kLong));
    selection->weights = at::empty({s, h, kept}, q.options());
    a.sel_index = selection->indices.data_ptr<int64_t>();
    a.sel_weight = selection->weights.data_ptr<float>();
  }
  // bf16 / fp16 caches have the warp kernel only: a forced variant (KRAUSE_CUDA_KERNEL=block)
  // applies to fp32 caches.
  C10_CUDA_CHECK(cuda::DecodeStep(
      a, stream, a.cache == cuda::CacheType::kFloat32 ? KernelVariant() : cuda::Variant::kWarp));
  return out;
}

}  // namespace krause::internal
