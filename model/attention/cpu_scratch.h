// Per-worker scratch of the fused CPU kernels (cpu_kernels.h), held in LibTorch tensors so that
// memory accounting (bench/counting_allocator.h) sees it. Used by the prefill and the decode step.
#pragma once

#include <ATen/ATen.h>

#include "model/attention/cpu_kernels.h"

namespace krause::cpu {

class ScratchTensors {
 public:
  // Scratch for queries with at most `max_candidates` candidates.
  explicit ScratchTensors(int64_t max_candidates)
      : raw_floats_(ScratchFloats(max_candidates)),
        floats_(at::empty({raw_floats_ + 2 * max_candidates}, at::kFloat)),
        keys_(at::empty({max_candidates}, at::kLong)),
        ints_(at::empty({2 * max_candidates}, at::kInt)) {
    float* f = floats_.data_ptr<float>();
    int32_t* i = ints_.data_ptr<int32_t>();
    view_ = Scratch{f,
                    f + raw_floats_,
                    i + max_candidates,
                    keys_.data_ptr<int64_t>(),
                    i,
                    f + raw_floats_ + max_candidates,
                    raw_floats_ / kQueryGroup};
  }
  const Scratch& view() const { return view_; }

 private:
  int64_t raw_floats_;
  at::Tensor floats_, keys_, ints_;
  Scratch view_;
};

}  // namespace krause::cpu
