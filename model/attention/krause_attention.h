// Krause attention: the one entry point and the implementations behind it.
//
// The operator (docs/operator.md, section 1), per head h with sigma_h = exp(log_sigma_h):
//   score(i, j) = -||q_i - k_j||^2 / (2 sigma_h^2)             for j in N(i)
//   S(i)        = the min(top_k, |N(i)|) members of N(i) with the largest score
//   out_i       = sum_{j in S(i)} softmax_S(i)(score)_j * v_j
//
// Tie rule (every implementation): candidates are ranked by score, descending; on an exactly equal
// score the LARGER key index ranks first. So on a blank background the most recent / last keys
// are kept. Returned selections list the kept keys in that rank order.
//
// Implementations (same signature, same contract; tests force each one):
//   kReference  dense N x N scores, mask, stable sort, softmax: the contract in code. O(N^2)
//               memory. Any floating dtype, any device. Slow on purpose: never optimised.
//   kWindowed   device-agnostic LibTorch, differentiable (including d/d log_sigma), O(N*W)
//               memory: causal windows in query blocks, grids through a candidate table. The
//               training path and the GPU fallback.
//   kFusedCpu   inference kernel for fp32 CPU tensors: O(N*W*d) time, O(W) scratch per thread,
//               parallel over (batch, head, query block), vectorised inner loops, exact top-k by
//               partial selection, row max subtracted before exp. No autograd.
//   kCuda       inference kernels for fp32 CUDA tensors (cuda/krause_cuda.h): one block per query
//               row, exact radix top-k in shared memory. No autograd. Only in builds with
//               KRAUSE_WITH_CUDA; elsewhere asking for it is InvalidArgument.
//   kAuto       without gradients: kFusedCpu for fp32 CPU tensors and kCuda for fp32 CUDA
//               tensors (CUDA builds); with gradients: kFusedCpuTrain for fp32 CPU tensors,
//               else kWindowed.
//
// Scores in the fast paths use the equivalent bias form (q_i . k_j + b_j) / sigma^2 with
// b_j = -||k_j||^2 / 2: ||q_i||^2 is constant per row and cancels in ranking and softmax.
//
// Thread-safety: the functions are reentrant; kFusedCpu uses ATen's intra-op thread pool.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "model/attention/neighbourhood.h"

namespace krause {

// kFusedCpuTrain: the fused CPU forward with a hand-written backward over the kept keys
// (fused_cpu_train.cc): kAuto's choice for fp32 CPU tensors that need gradients (training).
enum class KrauseImpl { kAuto, kReference, kWindowed, kFusedCpu, kCuda, kFusedCpuTrain };
const char* KrauseImplName(KrauseImpl impl);
// A model's serving implementation (cuda, fused_cpu or windowed: the load-time kernel check's
// choice, engine/kernel_check.h) as the `impl` its LibTorch forwards take: kWindowed for
// kWindowed, else kAuto (which takes the device's kernel).
KrauseImpl ForwardImpl(KrauseImpl serving);

struct KrauseOptions {
  Neighbourhood neighbourhood;
  int64_t top_k = 1;
  // Also return the kept indices and weights per query (for inspection and tests).
  bool return_selection = false;
  KrauseImpl impl = KrauseImpl::kAuto;
};

struct KrauseResult {
  at::Tensor out;  // [B, H, N, d], dtype of q
  // Only when return_selection. K = min(top_k, MaxCandidates(neighbourhood, N)).
  at::Tensor indices;  // [B, H, N, K] int64: kept key indices in rank order, -1 padded
  at::Tensor weights;  // [B, H, N, K] dtype of q: their softmax weights, 0 padded
};

// q, k, v: [B, H, N, d], same dtype and device.
// log_sigma: one value for all heads (numel 1, e.g. a per-layer scalar) or one per head
//   (numel H, e.g. shape [H], [H, 1, 1] or [1, H, 1, 1]); must be finite.
// Errors (InvalidArgument, naming the argument): rank or shape mismatch, dtype/device mismatch,
// top_k < 1, window < 1, grid that does not match N, non-finite log_sigma, an implementation that
// cannot take these tensors (kFusedCpu on CUDA or non-fp32). Nothing aborts; LibTorch errors are
// caught and returned as Internal.
absl::StatusOr<KrauseResult> KrauseAttention(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& log_sigma,
                                             const KrauseOptions& options);

namespace internal {

// Validated inputs handed to an implementation. log_sigma is [H] (broadcast if it was shared).
struct AttentionArgs {
  at::Tensor q, k, v, log_sigma;
  int64_t batch = 0, heads = 0, n = 0, head_dim = 0;
  int64_t kept = 0;  // K = min(top_k, MaxCandidates)
};

absl::StatusOr<AttentionArgs> ValidateAttentionArgs(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v,
                                                    const at::Tensor& log_sigma,
                                                    const KrauseOptions& options);

// The implementations; each expects validated arguments. They may throw c10::Error, which
// KrauseAttention turns into a Status.
KrauseResult ReferenceAttention(const AttentionArgs& a, const KrauseOptions& o);
KrauseResult WindowedAttention(const AttentionArgs& a, const KrauseOptions& o);

// How WindowedAttention scores the patch rows of a grid neighbourhood:
//   kCandidateTable: gather each row's candidate keys and values through a table, O(N * C * d);
//   kDenseRows:      score the rows against all N keys (OrderedDots) and gather the candidates'
//                    scores (aggregation by one matmul with the scattered weights), O(N^2);
//   kAuto:           kDenseRows when N * N <= N * C * d (no more memory than the table), which
//                    holds for the small grids of image classifiers (7x7 patches + CLS: a 1.44x
//                    faster training step in krause-train-bench).
// Both give the same kept sets and weights; tests force each (SetGridRouteForTesting).
enum class GridRoute { kAuto, kCandidateTable, kDenseRows };
void SetGridRouteForTesting(GridRoute route);
KrauseResult FusedCpuAttention(const AttentionArgs& a, const KrauseOptions& o);
KrauseResult FusedCpuTrainAttention(const AttentionArgs& a, const KrauseOptions& o);
#ifdef KRAUSE_WITH_CUDA
// OK when the CUDA kernels take these shapes (at most 2048 candidates per row, head dimension
// at most 256), else InvalidArgument naming the limit; cheap (no candidate table is built for a
// causal or global neighbourhood). kAuto falls back to WindowedAttention where they do not.
absl::Status CudaTakes(const AttentionArgs& a, const KrauseOptions& o);
KrauseResult CudaAttention(const AttentionArgs& a, const KrauseOptions& o);
// The CUDA kernels' variant (cuda/krause_cuda.h): a thread block or a warp per row. kAuto takes
// the warp kernel for the rows that fit it (up to 256 candidates) and the block kernel for the
// others, unless the environment variable
// KRAUSE_CUDA_KERNEL=block (or warp) says otherwise; tests force each. Prefill and decode alike.
enum class CudaKernel { kAuto, kBlock, kWarp };
void SetCudaKernelForTesting(CudaKernel kernel);
#endif

}  // namespace internal
}  // namespace krause
