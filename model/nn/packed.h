// Building blocks of the packed CPU inference paths (engine/cpu_decoder.h, the KARM/ARM decode
// step; vit_cpu.h, the classifier forward): weights copied once into the layouts of the fused CPU
// kernels (cpu_kernels.h) and row operations with a fixed summation order, so a row's result has
// the same bits whatever the other rows (batch invariance) and whatever the thread split.
// Thread-safety: packed weights are immutable; the functions are pure over caller buffers, except
// ThreadScratch::Get(), which is per thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/attention/cpu_kernels.h"
#include "model/nn/parameters.h"

namespace krause::nn {

// out = x W^T + b, packed as cpu_kernels.h's LinearRowsArgs wants. The weights are fp32 (`wt`) or
// bfloat16 (`wt16`, elem kBFloat16: half the bytes; the kernel widens them exactly); the biases
// are fp32 either way.
struct PackedLinear {
  std::vector<float> wt;       // [out_pad / 16, in, 16]: LinearRowsArgs::wt's chunk blocks
  std::vector<uint16_t> wt16;  // the same blocks as bfloat16 bits (elem kBFloat16; wt empty)
  std::vector<float> bias;     // [out_pad]
  int64_t in = 0, out = 0, out_pad = 0;
  cpu::Elem elem = cpu::Elem::kFloat32;

  int64_t chunks() const { return out_pad / cpu::kScoreChunk; }
  // The bytes a pass over every row reads: the weights and the biases.
  int64_t bytes() const {
    return static_cast<int64_t>(wt.size() * sizeof(float) + wt16.size() * sizeof(uint16_t) +
                                bias.size() * sizeof(float));
  }
  // out rows (stride out_pad) = x rows (stride in) W^T + b, output column chunks [c0, c1).
  void Apply(const float* x, int64_t rows, float* out, int64_t c0, int64_t c1) const;
  void Apply(const float* x, int64_t rows, float* out) const { Apply(x, rows, out, 0, chunks()); }
};

// Weights [out, in] (and biases [out]) of one or more layers, stacked along their outputs
// (q, k, v -> one matrix); any dtype, fp32 copies, or with `elem` kBFloat16 the weights rounded
// to bfloat16 (nearest even, as LibTorch rounds). A weight of more dims is flattened to
// [out, rest] (a convolution whose kernel equals its stride is a linear layer over patches).
PackedLinear PackLinear(const std::vector<at::Tensor>& weights,
                        const std::vector<at::Tensor>& biases,
                        cpu::Elem elem = cpu::Elem::kFloat32);
// The same from `prefix.weight` / `prefix.bias` of a store, in the store's linear_dtype():
// bfloat16 blocks for a store whose linear weights were rounded (ParameterStore::RoundLinear).
PackedLinear PackLinear(const ParameterStore& p, const std::vector<std::string>& prefixes);

// A tensor's values as fp32.
std::vector<float> Floats(const at::Tensor& t);

// y = (x - mean) / sqrt(var + 1e-5) * w + b over one row; moments in double, summed in a fixed
// order (8 interleaved lanes, then a tree), the same for every row.
void LayerNormRow(const float* x, int64_t d, const float* w, const float* b, float* y);
// The erf GELU, as torch.nn.GELU() (the vectorised kernel of cpu_kernels.h).
void GeluRow(const float* x, int64_t n, float* y);
// q . k in a fixed order: 8 interleaved partial sums (vectorised), added pairwise, then the tail.
float Dot(const float* q, const float* k, int64_t d);
// y = softmax(x) over n values (row max subtracted), in index order.
void SoftmaxRow(const float* x, int64_t n, float* y);

// Per-thread scratch that only grows: after the first calls a step allocates nothing.
struct ThreadScratch {
  std::vector<float> rows;    // a task's row buffers
  std::vector<float> floats;  // the attention kernels' scratch (Kernel) or softmax scores
  std::vector<int32_t> ints;
  std::vector<int64_t> keys;
  std::vector<char> seen;
  std::vector<uint16_t> halves;  // bfloat16 activations (nn/dnnl_linear.h)
  int64_t max_candidates = -1;
  cpu::Scratch view{};

  // The calling thread's scratch.
  static ThreadScratch& Get();
  // Scratch for the fused kernels, rows of at most `candidates` candidates.
  const cpu::Scratch& Kernel(int64_t candidates);
  // `n` floats (invalidates Kernel()'s view).
  float* Floats(int64_t n);
  // `n` floats of row buffers.
  float* Rows(int64_t n);
  // `n` bfloat16 values.
  uint16_t* Halves(int64_t n);
};

}  // namespace krause::nn
