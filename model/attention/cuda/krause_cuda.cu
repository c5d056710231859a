// CUDA kernels of Krause attention: see krause_cuda.h for the contract.
//
// Two variants of each kernel, with the same scores, selection rule and aggregation order; their
// reductions (the softmax sum, in the decode step also ||k||^2) add in different orders, so the
// two agree to a few ulp, not bit for bit, on rows of more than 32 candidates:
// - block: one thread block per (batch, head, query row) in the prefill and per (sequence, head)
//   in the decode step. The block scores the row's candidates into shared memory, finds the exact
//   k-th largest score by a radix search over the scores' order-preserving bit patterns (32
//   block-wide counting rounds; the same selection as the CPU kernels), keeps every candidate
//   above it and, of those equal to it, the ones with the largest key index (the tie rule), then
//   runs the softmax over the kept set with the row max subtracted and aggregates V. Rows of up
//   to kMaxRow candidates.
// - warp: one warp per row, four rows per block. Each lane scores up to 8 candidates into
//   registers, their dot products interleaved (8 independent chains, loads in flight together;
//   in the decode step each key element is one coalesced load across the lanes); the radix search
//   counts with one warp reduction per round and the ties with ballots, with no block-wide barrier;
//   weights and positions go through the warp's own shared scratch for the aggregation. Rows of up
//   to kWarpRow candidates (e.g. causal W <= 256).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/attention/cuda/krause_cuda.h"
#include "model/attention/score_order.h"

namespace krause::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxRow = 2048;  // candidates per row held in shared memory
constexpr int kPerLane = static_cast<int>(kWarpRow / 32);  // warp kernels: candidates per lane
constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

// Ring cache elements: fp32, or bf16 / fp16 (rounded to nearest when stored).
__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float Load(const __half* p) { return __half2float(*p); }
template <typename T>
__device__ __forceinline__ T Store(float x);
template <>
__device__ __forceinline__ float Store<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
// fp16 saturates: a value beyond the largest finite half (65504) is stored as +-65504, not inf
// (an inf key would make its scores NaN). NaN stays NaN. KrauseRingCache::Rounded is the same
// rule on the host.
template <>
__device__ __forceinline__ __half Store<__half>(float x) {
  if (fabsf(x) > 65504.f) x = copysignf(65504.f, x);
  return __float2half_rn(x);
}

// Float -> uint32 with the scores' rank order (score_order.h: -0 is +0, NaN above every number).
// Never 0: that value marks a dropped candidate below.
__device__ __forceinline__ uint32_t OrderedBits(float x) { return ScoreKey(__float_as_uint(x)); }

__device__ float BlockSum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += red[w];
  return total;
}

__device__ float BlockMax(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float m = red[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, red[w]);
  return m;
}

__device__ int BlockCount(int local, int* counter) {
  __syncthreads();
  if (threadIdx.x == 0) *counter = 0;
  __syncthreads();
  if (local) atomicAdd(counter, local);
  __syncthreads();
  return *counter;
}

// Shared state of one row.
struct Row {
  float score[kMaxRow];
  uint32_t key[kMaxRow];
  int64_t pos[kMaxRow];  // key index (absolute position), ascending in c
  float q[kMaxHeadDim];
  float red[kThreads / 32];
  int counter;
};

// Radix search for the K-th largest of a row's ordered keys, one bit a round from the top:
// count_matching(mask, want) counts the row's keys with (key & mask) == want (every thread of
// the block or warp gets the same count). Returns that key; *need is how many keys equal to it
// are among the K largest.
template <typename CountMatching>
__device__ __forceinline__ uint32_t KthLargestKey(int K, const CountMatching& count_matching,
                                                  int* need) {
  uint32_t prefix = 0, mask = 0;
  *need = K;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t m = mask | (1u << bit), want = prefix | (1u << bit);
    const int cnt = count_matching(m, want);
    if (cnt >= *need) {
      prefix = want;
    } else {
      *need -= cnt;
    }
    mask = m;
  }
  return prefix;
}

// Given row.score / key / pos for c candidates, keeps K = min(kept, c) of them: on return
// row.score[c] holds the softmax weight of candidate c (0 when not kept). Optionally writes the
// kept positions and weights in rank order.
__device__ void SelectAndSoftmax(Row& row, int c, int kept, int64_t* sel_index, float* sel_weight,
                                 int sel_width) {
  const int K = min(kept, c);
  int need = 0;
  const uint32_t prefix = KthLargestKey(
      K,
      [&](uint32_t m, uint32_t want) {
        int local = 0;
        for (int i = threadIdx.x; i < c; i += kThreads) local += (row.key[i] & m) == want;
        return BlockCount(local, &row.counter);
      },
      &need);
  // Keep: above the K-th, or equal to it and among the `need` largest positions of the ties.
  // Every thread decides its candidates (reading others' keys) before any key is overwritten.
  __syncthreads();
  bool keep[kMaxRow / kThreads];
#pragma unroll
  for (int u = 0; u < kMaxRow / kThreads; ++u) {
    const int i = threadIdx.x + u * kThreads;
    keep[u] = false;
    if (i < c) {
      keep[u] = row.key[i] > prefix;
      if (!keep[u] && row.key[i] == prefix) {
        int larger_ties = 0;
        for (int j = i + 1; j < c; ++j) larger_ties += row.key[j] == prefix;
        keep[u] = larger_ties < need;
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kMaxRow / kThreads; ++u) {
    const int i = threadIdx.x + u * kThreads;
    if (i < c && !keep[u]) row.key[i] = 0;  // no score's key is 0: marks "dropped"
  }
  __syncthreads();
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < c; i += kThreads)
    if (row.key[i] != 0) local_max = fmaxf(local_max, row.score[i]);
  const float mx = BlockMax(local_max, row.red);
  float local_sum = 0;
  for (int i = threadIdx.x; i < c; i += kThreads) {
    const float w = row.key[i] != 0 ? __expf(row.score[i] - mx) : 0.f;
    local_sum += w;
  }
  const float sum = BlockSum(local_sum, row.red);
  // Ranks (descending rank key, ties: larger position first), before the scores are overwritten
  // with weights.
  if (sel_index != nullptr) {
    for (int r = threadIdx.x; r < sel_width; r += kThreads) {
      sel_index[r] = -1;
      sel_weight[r] = 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < c; i += kThreads) {
      if (row.key[i] == 0) continue;
      int rank = 0;
      for (int j = 0; j < c; ++j) {
        if (row.key[j] == 0 || j == i) continue;
        rank += row.key[j] > row.key[i] || (row.key[j] == row.key[i] && j > i);
      }
      sel_index[rank] = row.pos[i];
      sel_weight[rank] = __expf(row.score[i] - mx) / sum;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < c; i += kThreads)
    row.score[i] = row.key[i] != 0 ? __expf(row.score[i] - mx) / sum : 0.f;
  __syncthreads();
}

// out[t] = sum over the c candidates of weight[ci] * V[row][t], in candidate order, V rows
// `stride` floats apart, where row = pos % modulo for a ring (decode) and row = pos when modulo
// is 0 (prefill); zero weights are skipped. Output elements t = first, first + step, ... are this
// thread's (the block variant: every thread of the block; the warp variant: the lanes).
template <typename T>
__device__ void Aggregate(const float* weight, const int64_t* pos, int c, int64_t d, const T* v,
                          int64_t stride, int64_t modulo, float* out, int first, int step) {
  for (int64_t t = first; t < d; t += step) {
    float acc = 0;
    for (int ci = 0; ci < c; ++ci) {
      const float w = weight[ci];
      if (w == 0.f) continue;
      const int64_t r = modulo > 0 ? pos[ci] % modulo : pos[ci];
      acc = fmaf(w, Load(v + r * stride + t), acc);
    }
    out[t] = acc;
  }
}

// Where sequence s, head h of a decode step reads and writes: its position p, the ring column
// p % W, the offset of its q/k/v/out rows and its slot's ring (one layer).
template <typename T>
struct Ring {
  int64_t p, col, in;
  T* keys;      // [d, ring_stride], column p % W holds position p
  T* vals;      // [W, d]
  float* bias;  // [ring_stride]
};

template <typename T>
__device__ __forceinline__ Ring<T> RingOf(const DecodeArgs& a, int64_t s, int64_t h) {
  const int64_t slot = a.slots[s], ring = slot * a.heads + h;
  Ring<T> r;
  r.p = a.positions[s];
  r.col = r.p % a.window;
  r.in = (s * a.heads + h) * a.d;
  r.keys = static_cast<T*>(a.keys_t) + ring * a.d * a.ring_stride;
  r.vals = static_cast<T*>(a.values) + ring * a.window * a.d;
  r.bias = a.ring_bias + ring * a.ring_stride;
  return r;
}

__global__ void KeyBiasKernel(const float* k, int64_t rows, int64_t d, float* bias) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* kr = k + r * d;
  float s = 0;
  for (int64_t i = 0; i < d; ++i) s = fmaf(kr[i], kr[i], s);
  bias[r] = -0.5f * s;
}

__global__ void PrefillKernel(PrefillArgs a) {
  extern __shared__ unsigned char smem[];
  Row& row = *reinterpret_cast<Row*>(smem);
  // One block per (batch * heads + head, query row), flattened on x (y would cap B * H at 65535);
  // with a list of wide rows, only those rows.
  const int64_t rows = a.wide_rows != nullptr ? a.n_wide : a.n;
  const int64_t r = blockIdx.x % rows, bh = blockIdx.x / rows;
  const int64_t i = a.wide_rows != nullptr ? a.wide_rows[r] : r;
  const int64_t h = bh % a.heads;
  const int64_t base = bh * a.n;  // row offset of this (b, h)
  const int c = a.count[i];
  for (int t = threadIdx.x; t < a.d; t += kThreads) row.q[t] = a.q[(base + i) * a.d + t];
  __syncthreads();
  const float s2 = a.inv_sigma2[h];
  for (int ci = threadIdx.x; ci < c; ci += kThreads) {
    const int64_t j = a.cand[i * a.width + ci];
    const float* kr = a.k + (base + j) * a.d;
    float dot = 0;
    for (int64_t t = 0; t < a.d; ++t) dot = fmaf(row.q[t], kr[t], dot);
    const float s = (dot + a.bias[base + j]) * s2;
    row.score[ci] = s;
    row.key[ci] = OrderedBits(s);
    row.pos[ci] = j;
  }
  __syncthreads();
  const int64_t sel = (base + i) * a.kept;
  SelectAndSoftmax(row, c, static_cast<int>(a.kept), a.sel_index ? a.sel_index + sel : nullptr,
                   a.sel_weight ? a.sel_weight + sel : nullptr, static_cast<int>(a.kept));
  Aggregate(row.score, row.pos, c, a.d, a.v + base * a.d, a.d, 0, a.out + (base + i) * a.d,
            threadIdx.x, kThreads);
}

__global__ void DecodeKernel(DecodeArgs a) {
  extern __shared__ unsigned char smem[];
  Row& row = *reinterpret_cast<Row*>(smem);
  const int64_t s = blockIdx.x, h = blockIdx.y;
  const Ring<float> r = RingOf<float>(a, s, h);
  const int64_t p = r.p, col = r.col, in = r.in;
  float *keys = r.keys, *vals = r.vals, *bias = r.bias;
  // Append the new key (transposed), value and bias at column p % W.
  float local = 0;
  for (int t = threadIdx.x; t < a.d; t += kThreads) {
    const float kt = a.k[in + t];
    keys[t * a.ring_stride + col] = kt;
    vals[col * a.d + t] = a.v[in + t];
    row.q[t] = a.q[in + t];
    local = fmaf(kt, kt, local);
  }
  const float norm2 = BlockSum(local, row.red);
  if (threadIdx.x == 0) bias[col] = -0.5f * norm2;
  __syncthreads();
  const int c = static_cast<int>(a.window < p + 1 ? a.window : p + 1);
  const int64_t first = p - c + 1;
  const float s2 = a.inv_sigma2[h];
  for (int ci = threadIdx.x; ci < c; ci += kThreads) {
    const int64_t pos = first + ci, cc = pos % a.window;
    float dot = 0;
    for (int64_t t = 0; t < a.d; ++t) dot = fmaf(row.q[t], keys[t * a.ring_stride + cc], dot);
    const float sc = (dot + bias[cc]) * s2;
    row.score[ci] = sc;
    row.key[ci] = OrderedBits(sc);
    row.pos[ci] = pos;
  }
  __syncthreads();
  const int64_t sel = (s * a.heads + h) * a.kept;
  SelectAndSoftmax(row, c, static_cast<int>(a.kept), a.sel_index ? a.sel_index + sel : nullptr,
                   a.sel_weight ? a.sel_weight + sel : nullptr, static_cast<int>(a.kept));
  Aggregate(row.score, row.pos, c, a.d, vals, a.d, a.window, a.out + in, threadIdx.x, kThreads);
}

// ---- warp-per-row variant ----

// One warp's shared scratch for its row.
struct WarpRow {
  alignas(16) float q[kMaxHeadDim];
  float w[kWarpRow];       // softmax weight per candidate (0: dropped or underflowed)
  uint32_t key[kWarpRow];  // the candidates' rank keys (score_order.h), for the ranks
  int64_t pos[kWarpRow];   // key position of a kept candidate, -1 for a dropped one
};

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// The warp's sum of an integer: one instruction from sm_80 on, shuffles before (an architecture
// list with older GPUs, e.g. from TORCH_CUDA_ARCH_LIST, must still compile). Exact either way.
__device__ __forceinline__ int WarpCount(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(v)));
#else
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
#endif
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// This lane's candidates are ci = lane + 32 u < c (ascending key position in ci), with their
// scores, ordered bit patterns and positions. Keeps K = min(kept, c) of them with the tie rule
// and leaves each candidate's softmax weight in row.w (and row.pos / row.key) for the
// aggregation; optionally writes the selection in rank order.
__device__ __forceinline__ void WarpSelectAndSoftmax(const float (&score)[kPerLane],
                                                     const uint32_t (&key)[kPerLane],
                                                     const int64_t (&pos)[kPerLane], int c,
                                                     int kept, WarpRow& row, int64_t* sel_index,
                                                     float* sel_weight, int sel_width) {
  const int lane = threadIdx.x & 31;
  const int K = min(kept, c);
  int need = 0;
  const uint32_t prefix = KthLargestKey(
      K,
      [&](uint32_t m, uint32_t want) {
        int local = 0;
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) local += (lane + 32 * u < c) && ((key[u] & m) == want);
        return WarpCount(local);
      },
      &need);
  // Keep: above the K-th, or equal to it and among the `need` largest positions of the ties
  // (ties at a larger ci: later lanes of the same u, and every lane of a larger u).
  bool keep[kPerLane];
  int later_ties = 0;
#pragma unroll
  for (int u = kPerLane - 1; u >= 0; --u) {
    const bool valid = lane + 32 * u < c;
    const bool tie = valid && key[u] == prefix;
    const unsigned ties = __ballot_sync(kFullMask, tie);
    const int above = __popc(ties & (0xfffffffeu << lane));
    keep[u] = valid && (key[u] > prefix || (tie && later_ties + above < need));
    later_ties += __popc(ties);
  }
  float local_max = -INFINITY;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u)
    if (keep[u]) local_max = fmaxf(local_max, score[u]);
  const float mx = WarpMax(local_max);
  float e[kPerLane];
  float local_sum = 0;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    e[u] = keep[u] ? __expf(score[u] - mx) : 0.f;
    local_sum += e[u];
  }
  const float sum = WarpSum(local_sum);
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int ci = lane + 32 * u;
    if (ci < c) {
      row.w[ci] = keep[u] ? e[u] / sum : 0.f;
      row.key[ci] = key[u];
      row.pos[ci] = keep[u] ? pos[u] : -1;
    }
  }
  __syncwarp();
  if (sel_index != nullptr) {
    for (int r = lane; r < sel_width; r += 32) {
      sel_index[r] = -1;
      sel_weight[r] = 0.f;
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      if (!keep[u]) continue;
      const int i = lane + 32 * u;
      int rank = 0;
      for (int j = 0; j < c; ++j) {
        if (row.pos[j] < 0 || j == i) continue;
        rank += row.key[j] > key[u] || (row.key[j] == key[u] && j > i);
      }
      sel_index[rank] = pos[u];
      sel_weight[rank] = e[u] / sum;
    }
  }
}

// Scores this lane's candidates ci = lane + 32 u < c, all of them together: t outer, candidates
// inner, so that their (up to 8) multiply-add chains and loads are in flight at once; each
// chain in the block kernel's order (t ascending), so the scores are the block kernel's.
// position_of(ci, &where) gives a candidate's key position and where its key lives; load(where,
// t) its t-th key element (kVec 1) or elements t..t+3 (kVec 4, a float4); bias_of(where) its
// key bias.
template <int kVec, typename PositionOf, typename Load, typename BiasOf>
__device__ __forceinline__ void ScoreLaneCandidates(int c, int64_t d, const float* q, float s2,
                                                    const PositionOf& position_of, const Load& load,
                                                    const BiasOf& bias_of, float (&score)[kPerLane],
                                                    uint32_t (&key)[kPerLane],
                                                    int64_t (&pos)[kPerLane]) {
  const int lane = threadIdx.x & 31;
  int64_t where[kPerLane];
  float dot[kPerLane];
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int ci = lane + 32 * u;
    where[u] = 0;
    pos[u] = ci < c ? position_of(ci, &where[u]) : -1;
    dot[u] = 0.f;
  }
  for (int64_t t = 0; t < d; t += kVec) {
    if constexpr (kVec == 4) {
      const float4 qv = *reinterpret_cast<const float4*>(q + t);
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        if (pos[u] < 0) continue;
        const float4 kv = load(where[u], t);
        dot[u] = fmaf(qv.x, kv.x, dot[u]);
        dot[u] = fmaf(qv.y, kv.y, dot[u]);
        dot[u] = fmaf(qv.z, kv.z, dot[u]);
        dot[u] = fmaf(qv.w, kv.w, dot[u]);
      }
    } else {
      const float qt = q[t];
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        if (pos[u] >= 0) dot[u] = fmaf(qt, load(where[u], t), dot[u]);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    score[u] = 0.f;
    key[u] = 0;
    if (pos[u] >= 0) {
      score[u] = (dot[u] + bias_of(where[u])) * s2;
      key[u] = OrderedBits(score[u]);
    }
  }
}

// Selection, softmax and aggregation of a scored row; `sel` offsets the optional selection
// outputs, V rows are `d` floats apart (row = pos % modulo for a ring, pos when modulo is 0).
template <typename T>
__device__ __forceinline__ void WarpFinishRow(const float (&score)[kPerLane],
                                              const uint32_t (&key)[kPerLane],
                                              const int64_t (&pos)[kPerLane], int c, int64_t kept,
                                              WarpRow& row, int64_t* sel_index, float* sel_weight,
                                              int64_t sel, int64_t d, const T* v, int64_t modulo,
                                              float* out) {
  WarpSelectAndSoftmax(score, key, pos, c, static_cast<int>(kept), row,
                       sel_index ? sel_index + sel : nullptr,
                       sel_weight ? sel_weight + sel : nullptr, static_cast<int>(kept));
  Aggregate(row.w, row.pos, c, d, v, d, modulo, out, threadIdx.x & 31, 32);
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32) PrefillWarpKernel(PrefillArgs a) {
  __shared__ WarpRow rows[kWarpsPerBlock];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // One warp per (batch * heads + head, query row), flattened.
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (g >= a.n * a.batch * a.heads) return;  // the whole warp: no block-wide barrier follows
  const int64_t i = g % a.n, bh = g / a.n;
  const int c = a.count[i];
  if (c > kWarpRow) return;  // a wide row of a mixed launch: the block kernel's (the whole warp)
  const int64_t h = bh % a.heads;
  const int64_t base = bh * a.n;
  WarpRow& row = rows[warp];
  for (int64_t t = lane; t < a.d; t += 32) row.q[t] = a.q[(base + i) * a.d + t];
  __syncwarp();
  const float s2 = a.inv_sigma2[h];
  // Rows of K start 16-byte aligned when K does and d is a multiple of 4 (a view with an odd
  // storage offset must not take the vector loads: a misaligned load is a sticky CUDA error).
  const bool vector_loads = a.d % 4 == 0 && (reinterpret_cast<uintptr_t>(a.k) & 15u) == 0;
  float score[kPerLane];
  uint32_t key[kPerLane];
  int64_t pos[kPerLane];
  // Candidate j's key is row base + j of K.
  const auto position_of = [&](int ci, int64_t* where) {
    const int64_t j = a.cand[i * a.width + ci];
    *where = j;
    return j;
  };
  const auto bias_of = [&](int64_t j) { return a.bias[base + j]; };
  if (vector_loads) {  // 16-byte loads of the key rows; the same fmaf order
    ScoreLaneCandidates<4>(
        c, a.d, row.q, s2, position_of,
        [&](int64_t j, int64_t t) {
          return *reinterpret_cast<const float4*>(a.k + (base + j) * a.d + t);
        },
        bias_of, score, key, pos);
  } else {
    ScoreLaneCandidates<1>(
        c, a.d, row.q, s2, position_of,
        [&](int64_t j, int64_t t) { return a.k[(base + j) * a.d + t]; }, bias_of, score, key, pos);
  }
  WarpFinishRow(score, key, pos, c, a.kept, row, a.sel_index, a.sel_weight, (base + i) * a.kept,
                a.d, a.v + base * a.d, 0, a.out + (base + i) * a.d);
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) DecodeWarpKernel(DecodeArgs a) {
  __shared__ WarpRow rows[kWarpsPerBlock];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (g >= a.seqs * a.heads) return;  // the whole warp
  const int64_t s = g / a.heads, h = g % a.heads;
  const Ring<T> r = RingOf<T>(a, s, h);
  const int64_t p = r.p, col = r.col, in = r.in;
  T *keys = r.keys, *vals = r.vals;
  float* bias = r.bias;
  WarpRow& row = rows[warp];
  // Append the new key (transposed), value and bias at column p % W; the bias is the key's as
  // stored (rounded to T).
  float local = 0;
  for (int64_t t = lane; t < a.d; t += 32) {
    const T stored = Store<T>(a.k[in + t]);
    keys[t * a.ring_stride + col] = stored;
    vals[col * a.d + t] = Store<T>(a.v[in + t]);
    row.q[t] = a.q[in + t];
    const float kt = Load(&stored);
    local = fmaf(kt, kt, local);
  }
  const float norm2 = WarpSum(local);
  if (lane == 0) bias[col] = -0.5f * norm2;
  __syncwarp();  // the new column is read back by other lanes below
  const int c = static_cast<int>(a.window < p + 1 ? a.window : p + 1);
  const int64_t first = p - c + 1;
  const float s2 = a.inv_sigma2[h];
  float score[kPerLane];
  uint32_t key[kPerLane];
  int64_t pos[kPerLane];
  // Position first + ci lives in ring column (first + ci) % W (transposed keys: coalesced
  // across the lanes).
  ScoreLaneCandidates<1>(
      c, a.d, row.q, s2,
      [&](int ci, int64_t* where) {
        const int64_t kpos = first + ci;
        *where = kpos % a.window;
        return kpos;
      },
      [&](int64_t cc, int64_t t) { return Load(keys + t * a.ring_stride + cc); },
      [&](int64_t cc) { return bias[cc]; }, score, key, pos);
  WarpFinishRow(score, key, pos, c, a.kept, row, a.sel_index, a.sel_weight,
                (s * a.heads + h) * a.kept, a.d, vals, a.window, a.out + in);
}

}  // namespace

cudaError_t KeyBias(const float* k, int64_t rows, int64_t d, float* bias, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int64_t blocks = (rows + 255) / 256;
  KeyBiasKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(k, rows, d, bias);
  return cudaGetLastError();
}

cudaError_t Prefill(const PrefillArgs& a, cudaStream_t stream, Variant variant) {
  if (a.width > kMaxRow || a.width > kMaxCandidates || a.d > kMaxHeadDim)
    return cudaErrorInvalidValue;
  if (variant == Variant::kWarp && a.width > kWarpRow) return cudaErrorInvalidValue;
  if (a.n == 0 || a.batch * a.heads == 0) return cudaSuccess;
  // kAuto: the warp kernel for rows of up to kWarpRow candidates, the block kernel for wider
  // ones; a table with both (a grid with CLS over 256 tokens, causal W > 256) runs both kernels,
  // each on its rows.
  const bool narrow_only =
      variant == Variant::kWarp || (variant == Variant::kAuto && a.width <= kWarpRow);
  const bool mixed = variant == Variant::kAuto && a.width > kWarpRow && a.wide_rows != nullptr &&
                     a.n_wide > 0 && a.n_wide < a.n;
  if (narrow_only || mixed) {
    const int64_t warps = a.n * a.batch * a.heads;
    const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    PrefillWarpKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(a);
    const cudaError_t e = cudaGetLastError();
    if (narrow_only || e != cudaSuccess) return e;
  }
  PrefillArgs b = a;
  if (!mixed) b.wide_rows = nullptr;  // every row
  const size_t smem = sizeof(Row);
  cudaError_t e = cudaFuncSetAttribute(PrefillKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const int64_t blocks = (mixed ? a.n_wide : a.n) * a.batch * a.heads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;  // x dimension limit
  PrefillKernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(b);
  return cudaGetLastError();
}

cudaError_t DecodeStep(const DecodeArgs& a, cudaStream_t stream, Variant variant) {
  if (a.window > kMaxRow || a.d > kMaxHeadDim) return cudaErrorInvalidValue;
  const bool reduced = a.cache != CacheType::kFloat32;
  if ((variant == Variant::kWarp || reduced) && a.window > kWarpRow) return cudaErrorInvalidValue;
  if (reduced && variant == Variant::kBlock) return cudaErrorInvalidValue;
  if (a.seqs == 0 || a.heads == 0) return cudaSuccess;
  if (variant == Variant::kWarp || reduced || (variant == Variant::kAuto && a.window <= kWarpRow)) {
    const int64_t blocks = (a.seqs * a.heads + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    const unsigned grid = static_cast<unsigned>(blocks);
    switch (a.cache) {
      case CacheType::kBFloat16:
        DecodeWarpKernel<__nv_bfloat16><<<grid, kWarpsPerBlock * 32, 0, stream>>>(a);
        break;
      case CacheType::kFloat16:
        DecodeWarpKernel<__half><<<grid, kWarpsPerBlock * 32, 0, stream>>>(a);
        break;
      default:
        DecodeWarpKernel<float><<<grid, kWarpsPerBlock * 32, 0, stream>>>(a);
    }
    return cudaGetLastError();
  }
  const size_t smem = sizeof(Row);
  cudaError_t e = cudaFuncSetAttribute(DecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.heads));
  DecodeKernel<<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace krause::cuda
