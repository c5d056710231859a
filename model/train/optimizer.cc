#include "model/train/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace krause {

AdamW::AdamW(ParameterStore* params, AdamWOptions options) : params_(params), options_(options) {
  for (const auto& [name, p] : params_->items()) {
    m_.push_back(at::zeros_like(p).detach());
    v_.push_back(at::zeros_like(p).detach());
  }
}

void AdamW::ZeroGrad() {
  for (const auto& [name, p] : params_->items()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void AdamW::Step(double lr) {
  at::NoGradGuard no_grad;
  ++steps_;
  const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(steps_));
  size_t i = 0;
  for (const auto& [name, p] : params_->items()) {
    at::Tensor& m = m_[i];
    at::Tensor& v = v_[i];
    ++i;
    if (!p.grad().defined()) continue;
    const at::Tensor g = p.grad();
    if (p.dim() >= 2 && options_.weight_decay > 0) p.mul_(1.0 - lr * options_.weight_decay);
    m.mul_(options_.beta1).add_(g, 1.0 - options_.beta1);
    v.mul_(options_.beta2).addcmul_(g, g, 1.0 - options_.beta2);
    const at::Tensor denom = (v / bc2).sqrt_().add_(options_.eps);
    p.addcdiv_(m, denom, -lr / bc1);
  }
}

NamedTensors AdamW::State() const {
  NamedTensors s;
  size_t i = 0;
  for (const auto& [name, p] : params_->items()) {
    s.push_back({"m." + name, m_[i]});
    s.push_back({"v." + name, v_[i]});
    ++i;
  }
  s.push_back({"step", at::full({1}, steps_, at::kLong)});
  return s;
}

absl::Status AdamW::LoadState(const NamedTensors& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  if (!by_name.count("step")) return absl::InvalidArgumentError("optimizer state: missing step");
  size_t i = 0;
  for (const auto& [name, p] : params_->items()) {
    for (auto [prefix, dst] : {std::pair<const char*, at::Tensor*>{"m.", &m_[i]}, {"v.", &v_[i]}}) {
      auto it = by_name.find(prefix + name);
      if (it == by_name.end() || !it->second.sizes().equals(p.sizes())) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state: missing or mis-shaped ", prefix, name));
      }
      dst->copy_(it->second);
    }
    ++i;
  }
  steps_ = by_name["step"].item<int64_t>();
  return absl::OkStatus();
}

double WarmupCosine(int64_t step, int64_t warmup, int64_t total, double peak, double min_ratio) {
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step + 1) / warmup;
  const double span = std::max<int64_t>(1, total - warmup);
  const double t = std::min(1.0, static_cast<double>(step - warmup) / span);
  return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(M_PI * t)));
}

double ClipGradNorm(ParameterStore* params, double max_norm) {
  at::NoGradGuard no_grad;
  double total = 0;
  for (const auto& [name, p] : params->items()) {
    if (p.grad().defined()) total += p.grad().pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(total);
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto& [name, p] : params->items()) {
      if (p.grad().defined()) p.mutable_grad().mul_(scale);
    }
  }
  return norm;
}

}  // namespace krause
