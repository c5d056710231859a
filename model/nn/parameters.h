// ParameterStore: a model's named parameters in the authors' state_dict layout, with strict
// loading from a checkpoint and the list used by the optimiser.
//
// Names are the official ones (docs/operator.md, section 4), so a converted official checkpoint
// loads by name. Thread-safety: none; a model is built, loaded and then only read by inference.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "model/checkpoint/safetensors.h"

namespace krause {

class ParameterStore {
 public:
  // Registers a parameter (requires_grad set) and returns it.
  at::Tensor Add(const std::string& name, at::Tensor init);
  const at::Tensor& Get(const std::string& name) const;
  bool Has(const std::string& name) const { return index_.count(name) > 0; }
  const NamedTensors& items() const { return items_; }
  int64_t NumParameters() const;

  // Copies `tensors` into the parameters (converting dtype). Strict: every parameter must be
  // present with the same shape (a 0-d and a 1-element 1-d tensor count as the same shape), and
  // nothing else may be present except names in `ignored` (derived buffers). On mismatch returns
  // InvalidArgument listing every missing, unexpected and mis-shaped tensor, and changes nothing.
  absl::Status LoadStrict(const NamedTensors& tensors, const std::set<std::string>& ignored = {});

  // Moves every parameter to `device` (keeps requires_grad).
  void To(const at::Device& device);

  // Marks `name` (registered) as a linear layer's weight (nn::AddLinear registers its weights so):
  // the tensors RoundLinear rounds.
  void MarkLinear(const std::string& name);
  // Serving with reduced-precision weights: rounds every linear layer's weight to the values of
  // `dtype` (kBFloat16: nearest even, as LibTorch converts; kFloat: unchanged), keeping them fp32
  // tensors, and records `dtype` as linear_dtype(). Every implementation (LibTorch ops, the packed
  // CPU paths, CUDA) then computes the same function of the same weights; the packed CPU paths
  // store them in half the bytes (nn::PackLinear). InvalidArgument for any other dtype. A later
  // LoadStrict restores fp32 (kFloat).
  absl::Status RoundLinear(at::ScalarType dtype);
  at::ScalarType linear_dtype() const { return linear_dtype_; }

 private:
  NamedTensors items_;
  std::map<std::string, size_t> index_;
  std::set<std::string> linear_;
  at::ScalarType linear_dtype_ = at::kFloat;
};

}  // namespace krause
