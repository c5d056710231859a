// The fused CPU kernels of Krause attention: prefill (fused_cpu.cc) and the batched decode step
// (decode.cc) share the building blocks in cpu_kernels.inc, so a token decoded step by step gets
// bit for bit the scores, the selection and the summation order that the prefill gave it.
//
// Variants: cpu_kernels.inc is compiled up to three times, as `base` (the compiler's default ISA)
// and, on x86-64, as `avx2` (-mavx2 -mfma) and `avx512` (AVX-512 F/VL/BW/DQ besides; its linear
// kernel uses 512-bit registers and gives the avx2 variant's bits); CpuKernels() picks the best the
// running CPU supports, and tests can force any (SetCpuKernelsForTesting). The .inc files use no
// LibTorch and no inline library code that could be shared between the two variants (ODR): only raw
// pointers and POD structs.
//
// Layout: keys are stored TRANSPOSED, kt[t * kt_stride + j] = k_j[t], so that the scores of one
// query against a run of keys vectorise over j; rows of kt are readable kScoreChunk - 1 floats
// past the last key (callers pad). Everything fp32 and contiguous, except a decode step's ring,
// whose keys and values may be bfloat16, and a linear layer's weights, which may be too (Elem).
//
// Thread-safety: the kernels are pure functions over caller-owned buffers; callers parallelise.
#pragma once

#include <cstdint>

namespace krause::cpu {

// Scores are produced in chunks of this many keys (two AVX2 registers).
constexpr int64_t kScoreChunk = 16;
// Queries scored together against one shared run of keys.
constexpr int64_t kQueryGroup = 4;

inline int64_t RoundUpToChunk(int64_t x) {
  return (x + kScoreChunk - 1) / kScoreChunk * kScoreChunk;
}

// Scratch one worker needs for queries with at most `max_candidates` candidates.
struct Scratch {
  float* raw;      // [kQueryGroup * RoundUpToChunk(max_candidates + kQueryGroup)]
  float* score;    // [max_candidates]
  int32_t* tmp;    // [max_candidates]
  int64_t* key;    // [max_candidates]
  int32_t* order;  // [max_candidates]
  float* weight;   // [max_candidates]
  int64_t raw_stride;
};
int64_t ScratchFloats(int64_t max_candidates);  // size of `raw`

// One (batch, head) slice of a prefill and a range of its queries.
struct PrefillSlice {
  const float* q;     // [N, d]
  const float* k;     // [N, d]
  const float* kt;    // [d, kt_stride]
  const float* bias;  // [N] : -||k_j||^2 / 2
  const float* v;     // [N, d]
  float inv_var;      // 1 / sigma^2 of this head
  int64_t n, d, kt_stride, top_k;
  // Neighbourhood: kind 0 = causal(window), 1 = global, 2 = candidate table.
  int kind;
  int64_t window;
  const int64_t* table;        // kind 2: [n, table_width], ascending, -1 padded
  const int64_t* table_count;  // kind 2: [n]
  int64_t table_width;
  float* out;          // [N, d]
  int64_t* sel_index;  // optional [N, kept]
  float* sel_weight;   // optional [N, kept]
  int64_t kept;
};

// The element type of a decode ring's keys and values, and of a linear layer's weights. A bfloat16
// ring stores each new key and value rounded to nearest even (as LibTorch's float -> bfloat16; a
// NaN stays a NaN), its bias is that of the rounded key, and the step computes in fp32 on the
// widened elements: the scores are exact RBF scores of the stored keys, in the fp32 ring's order
// of operations. bfloat16 linear weights likewise: widened exactly, then the fp32 kernel's sums,
// so the result has the bits of the fp32 kernel on the weights rounded to bfloat16.
enum class Elem : int32_t { kFloat32 = 0, kBFloat16 = 1 };

// One decode-step work item: one sequence, one head.
struct DecodeItem {
  const float* q;    // [d] the new token's query
  const float* k;    // [d] its key   (written into the ring)
  const float* v;    // [d] its value (written into the ring)
  void* ring_kt;     // [d, ring_stride] of `elem`: key of position p at column p % window
  void* ring_v;      // [window, d] of `elem`
  float* ring_bias;  // [ring_stride]
  Elem elem;
  int64_t position, window, ring_stride, d, top_k;
  float inv_var;
  float* out;          // [d]
  int64_t* sel_index;  // optional [min(top_k, window)]
  float* sel_weight;   // optional
  // Optional: the ring of the item the caller runs next (same window, stride, d and elem), which
  // the kernel asks the memory system for (into the core's L2), a few cache lines per step of its
  // own loops, while this item computes. A step's items each read their own ring (W keys and
  // values: 32 KB for W 128, d 32) from memory; without the hint most of an item's time was the
  // wait for it. Changes no result.
  const void* next_kt;
  const void* next_v;
  const float* next_bias;
};

// A batch-invariant linear layer: out[i, j] = bias[j] + sum_k x[i, k] * W[j, k], each sum
// accumulated in k order, so a row's result has the same bits whatever the other rows (GEMM
// libraries pick different kernels for different row counts). All rows, output column chunks
// [chunk_begin, chunk_end) of kScoreChunk columns; n_pad is a multiple of kScoreChunk, bias
// [n_pad], out rows of n_pad. The weights come in chunk blocks: wt[(c k + t) kScoreChunk + l] =
// W[c kScoreChunk + l, t], so that a chunk's k x 16 weights are one contiguous run: a step with
// few rows streams them from memory in order (a [k, n_pad] layout read each chunk as k lines
// n_pad floats apart, a page apart for wide layers: half the speed at one sequence).
// The weights may be bfloat16 (elem): half the bytes a step with few rows streams.
struct LinearRowsArgs {
  const float* x;  // [m, k]
  const void* wt;  // [n_pad / kScoreChunk, k, kScoreChunk] of `elem`
  const float* bias;
  float* out;  // [m, n_pad]
  int64_t m, k, n_pad;
  Elem elem = Elem::kFloat32;
};

// One (batch, head) slice of causal softmax attention, the ARM baseline's training path
// (causal_softmax.h): out_i = sum_{j <= i} p_ij v_j with p_ij = softmax over j <= i of
// scale * q_i . k_j. kt and vt hold k and v transposed ([d, stride], stride >=
// RoundUpToChunk(n), columns n.. zero). The forward writes out and lse (the per-query logsumexp
// of the scaled scores); the backward reads them with g = dL/d out and adds dL/dq, dL/dk and
// dL/dv into dq, dk and dv (zeroed by the caller), recomputing p from lse.
struct SoftmaxSlice {
  const float* q;   // [n, d]
  const float* k;   // [n, d]
  const float* kt;  // [d, stride]
  const float* v;   // [n, d]
  const float* vt;  // [d, stride] (backward)
  float scale;      // > 0 (1 / sqrt(d))
  int64_t n, d, stride;
  float* out;      // [n, d] forward: written; backward: read
  float* lse;      // [n]    forward: written; backward: read
  const float* g;  // [n, d] backward
  float *dq, *dk, *dv;
  // false: every query attends to all n keys (a classifier's dense attention; forward only).
  bool causal = true;
};
// Scratch floats a softmax slice of length n needs.
inline int64_t SoftmaxScratchFloats(int64_t n) { return 2 * kQueryGroup * RoundUpToChunk(n); }

struct CpuKernelTable {
  const char* name;
  void (*linear_rows)(const LinearRowsArgs& args, int64_t chunk_begin, int64_t chunk_end);
  void (*key_biases)(const float* k, int64_t count, int64_t d, float* bias);
  void (*prefill)(const PrefillSlice& slice, int64_t query_begin, int64_t query_end,
                  const Scratch& scratch);
  void (*decode)(const DecodeItem& item, const Scratch& scratch);
  // y[0, n) = GELU(x) (exact erf form, erf to 1.5e-7; the decode step's MLP).
  void (*gelu)(const float* x, int64_t n, float* y);
  // Causal softmax attention: the forward of queries [query_begin, query_end) of a slice, and
  // the backward of a whole slice (its key and value gradients sum over all its queries).
  void (*softmax_forward)(const SoftmaxSlice& slice, int64_t query_begin, int64_t query_end,
                          float* scratch);
  void (*softmax_backward)(const SoftmaxSlice& slice, float* scratch);
};

// The variant the process runs: the best this CPU supports, or the one the environment variable
// KRAUSE_CPU_KERNELS names ("base", "avx2", "avx512"), read once (tests and benchmarks force others
// per call with SetCpuKernelsForTesting).
const CpuKernelTable& CpuKernels();
// Why KRAUSE_CPU_KERNELS was not followed ("" when it was, or is unset): a name this build or CPU
// lacks. The server refuses to start then.
const char* CpuKernelsChoiceError();
// nullptr restores automatic choice. Returns false if `name` is not available on this CPU.
// Besides the variants, two fault injections for the load-time kernel check's tests
// (engine/kernel_check.h): "fault_values" (the best variant, but every row the Krause prefill and
// decode kernels write is off by 0.5 in its first element) and "fault_throw" (those two kernels
// throw std::runtime_error); the other kernels stay intact.
bool SetCpuKernelsForTesting(const char* name);
// Variants this build has and this CPU can run, best last.
int NumCpuKernelVariants();
// The variants that give the same bits form a family, named after its first member: "avx2" for
// avx2 and avx512 (the same multiply-adds in the same order), else the variant's own name. A
// resumed generation may continue on another machine of the same family only.
const char* CpuKernelFamily(const char* variant);
const char* CpuKernelVariantName(int i);

namespace base {
extern const CpuKernelTable kTable;
}
namespace avx2 {
extern const CpuKernelTable kTable;
}
namespace avx512 {
extern const CpuKernelTable kTable;
}

}  // namespace krause::cpu
