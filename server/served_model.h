// A served model behind one interface, whatever its kind: its spec, its public description
// (ModelInfo), its FLOPs per image, the gauges the metrics read, and Stop(). Each kind implements
// it in its own file (served_classifier.h, served_generator.h) with the operations it supports;
// the registry builds them through its table of kinds (registry.cc), and a caller that needs a
// kind's operations asks the registry for that kind (Registry::Find<ServedGenerator>) instead of
// testing pointers. Adding a kind touches its own file and that table (plus ModelKind and its
// proto enum).
//
// Thread-safety: the description is fixed at construction; Gauges() and the kinds' workers may
// be used from any thread; Stop() once, before destruction.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "model/attention/flops.h"
#include "model/loader.h"
#include "server/classify_batcher.h"
#include "server/generator_worker.h"
#include "server/model_info.h"
#include "server/options.h"

namespace krause::server {

// Observers the workers report to (metrics, tests); all optional. They run on the workers'
// threads.
struct WorkerHooks {
  std::function<void(const std::string& model, const BatchEvent&)> on_classify_batch;
  std::function<void(const std::string& model, const DecodeEvent&)> on_decode_step;
};

// What a served model's queues and caches hold now (metrics gauges, read at scrape time).
struct ModelGauges {
  int64_t queued_images = 0;  // a classify queue, or a generator's images waiting for a slot
  struct Cache {
    int64_t active_sequences = 0;         // sequences holding a slot
    int64_t slots = 0, slots_in_use = 0;  // a guided sequence holds two slots
    int64_t bytes_per_slot = 0;
  };
  std::optional<Cache> cache;  // models with a KV cache (generators)
};

class ServedModel {
 public:
  virtual ~ServedModel() = default;
  ServedModel(const ServedModel&) = delete;
  ServedModel& operator=(const ServedModel&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }
  const ModelInfo& info() const { return info_; }
  ModelKind kind() const { return info_.kind; }
  const AttentionCost& flops() const { return flops_; }  // per image (the calls' FLOP figures)
  const std::string& checkpoint() const { return info_.checkpoint; }
  void set_default(bool is_default) { info_.is_default = is_default; }  // the registry, at load
  // The registry, at build, before anyone else sees the model: the kernel check's outcome.
  void set_kernel_checks(std::string implementation, std::vector<KernelCheckRecord> checks) {
    info_.implementation = std::move(implementation);
    info_.kernel_checks = std::move(checks);
  }

  virtual ModelGauges Gauges() const = 0;
  // One all-zero image through the worker, waiting for its answer: checks that the model runs
  // and warms it (allocations, packed weights) before it serves. Model control calls it on a
  // version that no call can reach yet.
  virtual absl::Status WarmUp() = 0;
  // Stops the worker: what is queued or running ends with UNAVAILABLE / Cancelled.
  virtual void Stop() = 0;

 protected:
  // Fills the description's common part from the spec and the checkpoint; the kind fills the rest.
  ServedModel(ModelSpec spec, const LoadedModel& model, ModelKind kind);
  ModelInfo& mutable_info() { return info_; }

 private:
  const ModelSpec spec_;
  const AttentionCost flops_;
  ModelInfo info_;
};

}  // namespace krause::server
