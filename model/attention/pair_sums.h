// Score arithmetic that is a function of each (query, key) pair alone, for the LibTorch paths
// (windowed.cc, the LibTorch decode step, the ring caches' biases).
//
// The tie rule (krause_attention.h: on equal scores the larger key index wins) can only decide
// between scores that are bit-equal when their pairs are equal. A matrix product does not promise
// that: a GEMM kernel sums a dot product in an order that depends on where the pair falls in its
// blocking (OpenBLAS's Haswell and Zen kernels round a block's edge differently from its middle),
// so two identical keys could score one ulp apart and rounding would decide between them. These
// sum over t = 0 .. d-1 in that order, each product and each sum rounded on its own: on a GPU one
// LibTorch elementwise op at a time (an elementwise op rounds every element alike, vectorised or
// not), on the CPU a loop of the same arithmetic. docs/operator.md, section 1.2.
#pragma once

#include <ATen/core/Tensor.h>

namespace krause::internal {

// q_r . k_c for every (r, c): q [..., R, d], kt [..., d, C] (the keys transposed; leading dims
// broadcast) -> [..., R, C] in q's dtype. Accumulated in fp32 for fp16 / bf16 inputs (as a
// matrix product accumulates them), else in their own type. Differentiable: the backward takes
// its products from matmul (a gradient decides no selection, so it need not be exact per pair).
at::Tensor OrderedDots(const at::Tensor& q, const at::Tensor& kt);

// OrderedDots' arithmetic in LibTorch's elementwise ops on any device, without a graph: the path
// a GPU takes; on the CPU (fp32, fp64) OrderedDots runs a loop of the same arithmetic instead,
// and tests compare the two bit for bit.
at::Tensor OrderedDotsElementwise(const at::Tensor& q, const at::Tensor& kt);

// The sum over the last dimension in index order: [..., d] -> [...], differentiable; accumulated
// as OrderedDots accumulates.
at::Tensor OrderedSum(const at::Tensor& x);

// The biases -||k||^2 / 2 of keys as a ring cache stores them ([..., d], KrauseRingCache::Rounded),
// fp32 [...] on their device: on the CPU summed as the CPU decode kernel sums a new key's
// (cpu::CpuKernelTable::key_biases), on a GPU by OrderedSum. On the CPU a prefill (WritePrefix)
// and either decode step therefore give one key one bias. On a GPU the LibTorch step agrees with
// WritePrefix, but the CUDA decode kernels sum a new key's bias by a block or warp reduction of
// their own, a few ulp from this (not yet one rule there). No gradient.
at::Tensor StoredKeyBiases(const at::Tensor& stored);

}  // namespace krause::internal
