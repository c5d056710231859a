#include "model/nn/parameters.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/util/tensor_checks.h"

namespace krause {

at::Tensor ParameterStore::Add(const std::string& name, at::Tensor init) {
  init = init.detach().contiguous();
  init.set_requires_grad(true);
  index_[name] = items_.size();
  items_.push_back({name, init});
  return init;
}

const at::Tensor& ParameterStore::Get(const std::string& name) const {
  return items_.at(index_.at(name)).second;
}

int64_t ParameterStore::NumParameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : items_) n += t.numel();
  return n;
}

namespace {
bool SameShape(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes().equals(b.sizes())) return true;
  return a.numel() == 1 && b.numel() == 1 && a.dim() <= 1 && b.dim() <= 1;
}
}  // namespace

absl::Status ParameterStore::LoadStrict(const NamedTensors& tensors,
                                        const std::set<std::string>& ignored) {
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : tensors) given[name] = &t;
  std::vector<std::string> missing, unexpected, misshaped;
  for (const auto& [name, param] : items_) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
    } else if (!SameShape(*it->second, param)) {
      misshaped.push_back(absl::StrCat(name, " (checkpoint ", ShapeString(it->second->sizes()),
                                       ", model ", ShapeString(param.sizes()), ")"));
    }
  }
  for (const auto& [name, t] : given) {
    if (!index_.count(name) && !ignored.count(name)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::vector<std::string> parts;
    if (!missing.empty()) parts.push_back(absl::StrCat("missing: ", absl::StrJoin(missing, ", ")));
    if (!unexpected.empty()) {
      parts.push_back(absl::StrCat("unexpected: ", absl::StrJoin(unexpected, ", ")));
    }
    if (!misshaped.empty()) {
      parts.push_back(absl::StrCat("mis-shaped: ", absl::StrJoin(misshaped, "; ")));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint does not match the model: ", absl::StrJoin(parts, "; ")));
  }
  at::NoGradGuard no_grad;
  for (auto& [name, param] : items_) {
    const at::Tensor& src = *given.at(name);
    param.copy_(src.reshape(param.sizes()).to(param.scalar_type()));
  }
  linear_dtype_ = at::kFloat;
  return absl::OkStatus();
}

void ParameterStore::MarkLinear(const std::string& name) {
  Get(name);  // registered, or throws
  linear_.insert(name);
}

absl::Status ParameterStore::RoundLinear(at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear weights can be float32 or bfloat16, not ", at::toString(dtype)));
  }
  if (dtype == at::kBFloat16) {
    at::NoGradGuard no_grad;
    for (const std::string& name : linear_) {
      at::Tensor& w = items_.at(index_.at(name)).second;
      w.copy_(w.to(at::kBFloat16).to(w.scalar_type()));
    }
  }
  linear_dtype_ = dtype;
  return absl::OkStatus();
}

void ParameterStore::To(const at::Device& device) {
  for (auto& [name, t] : items_) {
    at::Tensor moved = t.detach().to(device);
    moved.set_requires_grad(true);
    t = moved;
  }
}

}  // namespace krause
