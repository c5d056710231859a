// AdamW with decoupled weight decay, a warmup-then-cosine learning-rate schedule and global-norm
// gradient clipping, over a ParameterStore. Its state saves and loads (for resume).
// Thread-safety: none (one training loop).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/checkpoint/safetensors.h"
#include "model/nn/parameters.h"

namespace krause {

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.05;
};

class AdamW {
 public:
  AdamW(ParameterStore* params, AdamWOptions options);
  // One update with learning rate `lr`; parameters with fewer than 2 dims (biases, norms,
  // log_sigma) get no weight decay.
  void Step(double lr);
  void ZeroGrad();
  int64_t steps() const { return steps_; }

  NamedTensors State() const;  // m.<name>, v.<name>, step
  absl::Status LoadState(const NamedTensors& state);

 private:
  ParameterStore* params_;
  AdamWOptions options_;
  std::vector<at::Tensor> m_, v_;
  int64_t steps_ = 0;
};

// Linear warmup over `warmup` steps, then cosine decay to `min_ratio * peak` at `total`.
double WarmupCosine(int64_t step, int64_t warmup, int64_t total, double peak,
                    double min_ratio = 0.0);

// Scales gradients so that their global L2 norm is at most max_norm; returns the norm before.
double ClipGradNorm(ParameterStore* params, double max_norm);

}  // namespace krause
