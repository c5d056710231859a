// CUDA kernels of Krause attention (fp32): the prefill over a candidate table (causal windows
// and grids alike) and the batched decode step over ring-buffer caches. Same contract as the CPU
// paths (krause_attention.h): bias-form scores (q . k + b) / sigma^2 with b = -||k||^2 / 2,
// exact top-k per row with the tie rule "equal score: larger key index wins", row max subtracted
// before exp, softmax over the kept set, aggregation of V.
//
// Plain CUDA: no LibTorch header, so the file compiles standalone with nvcc (CI compile-checks
// it for sm_90 on machines without a GPU). cuda/dispatch_cuda.cc wraps the launchers for CUDA
// tensors. All pointers are device pointers; launches go to `stream` and are asynchronous.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace krause::cuda {

// The most candidates per row the prefill kernel takes (scores live in shared memory).
constexpr int64_t kMaxCandidates = 2048;
// The largest head dimension of every kernel (a query row lives in shared memory).
constexpr int64_t kMaxHeadDim = 256;
// The most candidates per row (prefill) or the largest window (decode) of the warp variant.
constexpr int64_t kWarpRow = 256;

// Which kernel runs a row (krause_cuda.cu): one thread block per row (up to kMaxCandidates), or
// one warp per row (up to kWarpRow; far fewer barriers). kAuto: the warp where the row fits.
enum class Variant { kAuto, kBlock, kWarp };

// b[j] = -||k_j||^2 / 2 for rows of d floats. k: [rows, d], bias: [rows].
cudaError_t KeyBias(const float* k, int64_t rows, int64_t d, float* bias, cudaStream_t stream);

struct PrefillArgs {
  const float* q;           // [B, H, N, d]
  const float* k;           // [B, H, N, d]
  const float* v;           // [B, H, N, d]
  const float* bias;        // [B, H, N]   from KeyBias
  const float* inv_sigma2;  // [H]         exp(-2 log_sigma_h)
  // Candidates: row i holds N(i) ascending, -1 padded, `width` per row, `count[i]` valid.
  const int32_t* cand;   // [N, width]
  const int32_t* count;  // [N]
  int64_t width = 0;
  int64_t batch = 0, heads = 0, n = 0, d = 0;
  int64_t kept = 0;              // K = min(top_k, width)
  // Optional, for kAuto on a table wider than kWarpRow: the rows of more than kWarpRow
  // candidates, ascending. Then the block kernel runs these rows and the warp kernel the others
  // (a CLS row over a large grid need not send every patch row to the block kernel). Null: one
  // kernel, chosen by the width, runs every row.
  const int32_t* wide_rows = nullptr;  // [n_wide]
  int64_t n_wide = 0;
  float* out;                    // [B, H, N, d]
  int64_t* sel_index = nullptr;  // optional [B, H, N, K], rank order, -1 padded
  float* sel_weight = nullptr;   // optional [B, H, N, K], 0 padded
};
// kWarp with a.width > kWarpRow, a.width > kMaxCandidates or a.d > kMaxHeadDim:
// cudaErrorInvalidValue.
cudaError_t Prefill(const PrefillArgs& a, cudaStream_t stream, Variant variant = Variant::kAuto);

// The element type of a ring cache's keys and values (biases are always fp32). Reduced
// precision halves the bytes a decode step reads; the warp kernel only (W <= kWarpRow).
enum class CacheType { kFloat32, kBFloat16, kFloat16 };

struct DecodeArgs {
  const float* q;            // [S, H, d] new tokens
  const float* k;            // [S, H, d]
  const float* v;            // [S, H, d]
  const float* inv_sigma2;   // [H]
  const int64_t* slots;      // [S]
  const int64_t* positions;  // [S]
  int64_t seqs = 0, heads = 0, d = 0, window = 0, ring_stride = 0, kept = 0;
  // Ring caches (one layer): column p % W holds position p. Keys and values of `cache` type; a
  // new key is rounded to it before its bias is computed (scores use the stored key).
  void* keys_t;      // [slots, H, d, ring_stride]
  void* values;      // [slots, H, W, d]
  float* ring_bias;  // [slots, H, ring_stride]
  CacheType cache = CacheType::kFloat32;
  float* out;                    // [S, H, d]
  int64_t* sel_index = nullptr;  // optional [S, H, K] absolute positions, rank order
  float* sel_weight = nullptr;   // optional [S, H, K]
};
// Appends each sequence's new key, value and bias to its ring, then attends over its causal
// window (positions max(0, p - W + 1) .. p).
// kWarp with a.window > kWarpRow, or a reduced-precision cache with a.window > kWarpRow or
// kBlock: cudaErrorInvalidValue.
cudaError_t DecodeStep(const DecodeArgs& a, cudaStream_t stream, Variant variant = Variant::kAuto);

}  // namespace krause::cuda
