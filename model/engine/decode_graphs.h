// CUDA graphs for the KARM decode step.
//
// On a GPU the KARM's decode step has static shapes for a given number of sequences S and reads
// nothing back to the host (its slots and positions are device data, its scales validated once),
// so the whole step (embedding, every layer's linear layers and Krause decode kernel, the head)
// can be captured once per S and replayed: one launch instead of a few hundred kernel launches
// per step. The ARM's step cannot (the length it attends over is the batch's longest position, a
// host value that changes every step); nor can anything on the CPU.
//
// How: the graph of S reads the step's tokens, positions and slots from fixed device buffers,
// which Step() fills (asynchronous copies from the caller's pinned host tensors, on the current
// stream) before each replay. A graph for S is captured the second time a step of S sequences
// runs: the first runs eagerly, which also warms up cuBLAS and the allocator on the stream. All
// graphs share one memory pool. The logits of a replay live in the graph's pool, valid until the
// next Step(). A replay gives the bits of the eager step (same kernels, same shapes).
// If a capture fails, that step runs eagerly and graphs stay off for this object; reason() says
// why (the engine logs it once).
//
// Thread-safety: one engine thread, with its own (non-default) CUDA stream current.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "model/kv_cache.h"
#include "model/pixel_model.h"

namespace krause {

class DecodeGraphs {
 public:
  // Whether graphs can apply to this model here: a KARM on a GPU in a CUDA build against
  // LibTorch 2.1 or later (1.13's capture mode is process-global, which other models' worker
  // threads would trip over).
  static bool Supported(const PixelModel& model);

  // Borrows the model, its cache and its packed weights (all must outlive this object).
  // max_sequences: the largest S a step will have (the cache's slots).
  DecodeGraphs(const PixelModel* model, PixelKvCache* cache, const PixelDecodeWeights* packed,
               int64_t max_sequences);
  ~DecodeGraphs();

  // One decode step as PixelModel::DecodeStep with host tensors u, positions, slots [S] (pinned
  // ones make the copies asynchronous): replays the graph of S, captures it, or runs eagerly.
  // Returns logits [S, 256] on the model's device.
  at::Tensor Step(const at::Tensor& u, const at::Tensor& positions, const at::Tensor& slots);

  bool enabled() const { return enabled_; }
  int64_t graphs() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_steps_; }
  // Why graphs are off ("" while they are on).
  const std::string& reason() const { return reason_; }

 private:
  struct Graph;

  const PixelModel* model_;
  PixelKvCache* cache_;
  const PixelDecodeWeights* packed_;
  bool enabled_ = false;
  std::string reason_;
  at::Tensor u_, positions_, slots_;  // fixed device inputs [max_sequences]
  std::map<int64_t, int64_t> seen_;   // steps run per S before its capture
  std::map<int64_t, std::unique_ptr<Graph>> graphs_;
  std::shared_ptr<void> pool_;  // the graphs' shared memory pool id (CUDA builds)
  int64_t replays_ = 0, eager_steps_ = 0;
};

}  // namespace krause
