// Batch-invariant linear layers for decoding: the weights packed once (transposed, padded), then
// each row of the input computed with a fixed summation order (cpu_kernels.h, LinearRowsArgs),
// so a sequence's logits do not depend on which other sequences share its decode step. CPU, fp32.
// Thread-safety: a packed layer is immutable; Apply may run concurrently.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "model/nn/parameters.h"

namespace krause::nn {

class PackedLinear {
 public:
  PackedLinear() = default;
  // From `prefix.weight` [out, in] and `prefix.bias` [out] of a store.
  PackedLinear(const ParameterStore& p, const std::string& prefix);
  // x: [M, in] fp32 CPU -> [M, out]
  at::Tensor Apply(const at::Tensor& x) const;

 private:
  at::Tensor wt_;    // [in, out_pad]
  at::Tensor bias_;  // [out_pad]
  int64_t out_ = 0;
};

}  // namespace krause::nn
