#include "model/nn/packed.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

namespace krause::nn {

void PackedLinear::Apply(const float* x, int64_t rows, float* out, int64_t c0, int64_t c1) const {
  const void* w = elem == cpu::Elem::kBFloat16 ? static_cast<const void*>(wt16.data())
                                               : static_cast<const void*>(wt.data());
  const cpu::LinearRowsArgs a{x, w, bias.data(), out, rows, in, out_pad, elem};
  cpu::CpuKernels().linear_rows(a, c0, c1);
}

namespace {

// Lays out src [out, in] (row-major) as LinearRowsArgs::wt's chunk blocks in dst [out_pad * in]
// (zero-filled): column j is lane j % 16 of chunk j / 16, whose [in, 16] block is contiguous.
template <typename T>
void ToChunkBlocks(const T* src, int64_t out, int64_t in, T* dst) {
  constexpr int64_t kChunk = cpu::kScoreChunk;
  for (int64_t j = 0; j < out; ++j) {
    T* block = dst + (j / kChunk) * in * kChunk + j % kChunk;
    for (int64_t i = 0; i < in; ++i) block[i * kChunk] = src[j * in + i];
  }
}

}  // namespace

PackedLinear PackLinear(const std::vector<at::Tensor>& weights,
                        const std::vector<at::Tensor>& biases, cpu::Elem elem) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> w, b;
  for (const at::Tensor& t : weights) {
    w.push_back(t.detach().to(at::kCPU, at::kFloat).reshape({t.size(0), -1}));
  }
  for (const at::Tensor& t : biases) b.push_back(t.detach().to(at::kCPU, at::kFloat));
  const at::Tensor weight = at::cat(w, 0).contiguous(), bias = at::cat(b, 0).contiguous();
  PackedLinear l;
  l.out = weight.size(0);
  l.in = weight.size(1);
  l.out_pad = cpu::RoundUpToChunk(l.out);
  l.elem = elem;
  if (elem == cpu::Elem::kBFloat16) {
    // LibTorch's rounding (nearest even), then the raw bits.
    const at::Tensor rounded = weight.to(at::kBFloat16).contiguous();
    l.wt16.assign(l.in * l.out_pad, 0);
    ToChunkBlocks(reinterpret_cast<const uint16_t*>(rounded.data_ptr()), l.out, l.in,
                  l.wt16.data());
  } else {
    l.wt.assign(l.in * l.out_pad, 0.0f);
    ToChunkBlocks(weight.data_ptr<float>(), l.out, l.in, l.wt.data());
  }
  l.bias.assign(l.out_pad, 0.0f);
  std::copy_n(bias.data_ptr<float>(), l.out, l.bias.data());
  return l;
}

PackedLinear PackLinear(const ParameterStore& p, const std::vector<std::string>& prefixes) {
  std::vector<at::Tensor> w, b;
  for (const std::string& name : prefixes) {
    w.push_back(p.Get(name + ".weight"));
    b.push_back(p.Get(name + ".bias"));
  }
  return PackLinear(w, b,
                    p.linear_dtype() == at::kBFloat16 ? cpu::Elem::kBFloat16 : cpu::Elem::kFloat32);
}

std::vector<float> Floats(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

namespace {

// Sum of f(x[i]) in double over 8 interleaved lanes, then a fixed tree: the same order for every
// row and call (so batch-invariant), and independent lanes the compiler vectorises (one serial
// chain of double adds cost ~10% of the bundled classifier's forward).
template <typename F>
double LaneSum(const float* x, int64_t d, F f) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int u = 0; u < 8; ++u) acc[u] += f(static_cast<double>(x[i + u]));
  double total = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < d; ++i) total += f(static_cast<double>(x[i]));
  return total;
}

}  // namespace

void LayerNormRow(const float* x, int64_t d, const float* w, const float* b, float* y) {
  const double mean = LaneSum(x, d, [](double v) { return v; }) / static_cast<double>(d);
  const double var =
      LaneSum(x, d, [mean](double v) { return (v - mean) * (v - mean); }) / static_cast<double>(d);
  const float inv = static_cast<float>(1.0 / std::sqrt(var + 1e-5));
  const float m = static_cast<float>(mean);
  for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - m) * inv * w[i] + b[i];
}

void GeluRow(const float* x, int64_t n, float* y) { cpu::CpuKernels().gelu(x, n, y); }

float Dot(const float* q, const float* k, int64_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= d; t += 8)
    for (int u = 0; u < 8; ++u) acc[u] += q[t + u] * k[t + u];
  float dot = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; t < d; ++t) dot += q[t] * k[t];
  return dot;
}

void SoftmaxRow(const float* x, int64_t n, float* y) {
  float row_max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) row_max = std::max(row_max, x[i]);
  float total = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - row_max);
    total += y[i];
  }
  const float inv = 1.0f / total;
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

ThreadScratch& ThreadScratch::Get() {
  thread_local ThreadScratch s;
  return s;
}

const cpu::Scratch& ThreadScratch::Kernel(int64_t candidates) {
  if (candidates > max_candidates) {
    const int64_t raw = cpu::ScratchFloats(candidates);
    floats.assign(raw + 2 * candidates, 0.0f);
    ints.assign(2 * candidates, 0);
    keys.assign(candidates, 0);
    view =
        cpu::Scratch{floats.data(),         floats.data() + raw, ints.data() + candidates,
                     keys.data(),           ints.data(),         floats.data() + raw + candidates,
                     raw / cpu::kQueryGroup};
    max_candidates = candidates;
  }
  return view;
}

float* ThreadScratch::Floats(int64_t n) {
  if (static_cast<int64_t>(floats.size()) < n) {
    floats.assign(n, 0.0f);
    max_candidates = -1;  // Kernel() must rebuild its view over the new floats
  }
  return floats.data();
}

uint16_t* ThreadScratch::Halves(int64_t n) {
  if (static_cast<int64_t>(halves.size()) < n) halves.assign(n, 0);
  return halves.data();
}

float* ThreadScratch::Rows(int64_t n) {
  if (static_cast<int64_t>(rows.size()) < n) rows.assign(n, 0.0f);
  return rows.data();
}

}  // namespace krause::nn
