// A served model behind one interface, whatever its kind: its spec, its public description
// (ModelInfo), its FLOPs per image, the gauges the metrics read, Stop(), and the operations a
// front end runs on it (operations.h: Classify, Score, Generate, Inspect, and the class of a
// request). Each kind implements it in its own file (served_classifier.h, served_generator.h)
// and overrides the operations it supports; the others answer FAILED_PRECONDITION naming the
// model and its kind. A front end never casts to a kind. The registry builds the kinds through
// its table (registry.cc); adding a kind touches its own file and that table (plus ModelKind and
// its proto enum).
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
#include "server/core/classify_batcher.h"
#include "server/core/generator_worker.h"
#include "server/core/model_info.h"
#include "server/core/operations.h"
#include "server/core/options.h"

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
  // Calls queued, by tenant index (tenants.h): a classify queue's, or a generator's calls with an
  // image waiting for a slot. Shorter than the tenants: none for the rest.
  std::vector<int64_t> tenant_queued_calls;
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
    if (info_.kind == ModelKind::kGenerator) info_.numerics = GenerationNumerics(info_);
  }

  // The operations (operations.h says what they take and give, and on which thread `done` runs).
  // OK: the work is queued and `done` runs exactly once, later or before this returns; an error:
  // nothing was queued and `done` never runs.
  // Classifies images [n, H, W, C] uint8 (each the model's shape, 1 <= n <= its limit).
  virtual absl::Status Classify(at::Tensor images, const CallLimits& limits, ReplyPool* replies,
                                ClassifyDone done);
  // Bits per dimension of images [n, H, W, C] uint8; `classes` empty or one row per image (-1:
  // none; ClassRow checked them).
  virtual absl::Status Score(at::Tensor images, std::vector<int64_t> classes,
                             const CallLimits& limits, ReplyPool* replies, ScoreDone done);
  // The classes of the model's output (a classifier's probabilities) or condition (a
  // generator's; 0: unconditional).
  virtual int64_t Classes() const { return info_.classes; }
  // Subpixels scored per image (the Score reply's figure); 0 for a model that does not score.
  virtual int64_t ScoredPerImage() const { return 0; }
  // Submits one call's images (a GeneratePlan's) to be reported to `receiver` (the worker holds
  // it until the call's last image is done), for the call's tenant and priority (`share`: the
  // cache slots are shared by it, GeneratorWorker::Submit); CancelGeneration stops the
  // unfinished ones.
  virtual absl::Status Generate(std::vector<GenerationRequest> images,
                                std::shared_ptr<GenerationReceiver> receiver,
                                const Share& share = {});
  virtual void CancelGeneration(const GenerationReceiver* receiver) {}
  // The model's attention on one image [H, W, C] uint8, with the class row `class_row` (-1:
  // none), run beside the model's other work. InvalidArgument naming the option for options out
  // of range.
  virtual absl::Status Inspect(at::Tensor image, int64_t class_row, InspectOptions options,
                               const CallLimits& limits, ReplyPool* replies, InspectDone done);
  // A request's class, by its label (`by_name`) or its index, as the model's class row;
  // InvalidArgument naming `field` ("label: model M: ...") when the model has no such class or
  // takes none.
  virtual absl::StatusOr<int64_t> ClassRow(bool by_name, const std::string& label, int64_t index,
                                           const std::string& field) const;

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
