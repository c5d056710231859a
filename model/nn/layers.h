// Functional layers over a ParameterStore: the parameters are registered once under their
// official names, and forward passes look them up. Shapes are written at each boundary.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "model/nn/parameters.h"

namespace krause::nn {

// Registers `prefix.weight` [out, in] (truncated normal, std 0.02, marked as a linear weight:
// ParameterStore::RoundLinear) and `prefix.bias` [out] (0).
void AddLinear(ParameterStore* p, const std::string& prefix, int64_t in, int64_t out,
               at::Generator& gen);
// Registers `prefix.weight` (1) and `prefix.bias` (0), both [dim].
void AddLayerNorm(ParameterStore* p, const std::string& prefix, int64_t dim);

// x: [..., in] -> [..., out]
inline at::Tensor Linear(const ParameterStore& p, const std::string& prefix, const at::Tensor& x) {
  return at::linear(x, p.Get(prefix + ".weight"), p.Get(prefix + ".bias"));
}
inline at::Tensor LayerNorm(const ParameterStore& p, const std::string& prefix,
                            const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, p.Get(prefix + ".weight"), p.Get(prefix + ".bias"), 1e-5);
}
// Exact (erf) GELU, as torch.nn.GELU() by default.
inline at::Tensor Gelu(const at::Tensor& x) { return at::gelu(x); }

// Normal(0, std) truncated to [-2 std, 2 std].
at::Tensor TruncNormal(at::IntArrayRef shape, double std, at::Generator& gen);

// [B, N, H*d] <-> [B, H, N, d]
inline at::Tensor SplitHeads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}
inline at::Tensor MergeHeads(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

}  // namespace krause::nn
