// The model registry: name -> {spec, loaded model, its public description, its worker (the
// classify batcher or the generator's engine worker)}, built from the manifest.
// Thread-safety: built once, then read-only (the workers are thread-safe); Stop() once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/loader.h"
#include "server/classify_batcher.h"
#include "server/generator_worker.h"
#include "server/model_info.h"
#include "server/options.h"

namespace krause::server {

struct ServedModel {
  ModelSpec spec;
  LoadedModel model;
  AttentionCost flops;  // per image, computed once at load (the calls' FLOP figures)
  ModelInfo info;       // what ListModels / GetModel say (model_info_proto.h converts it)
  std::unique_ptr<ClassifyBatcher> batcher;    // classifiers
  std::unique_ptr<GeneratorWorker> generator;  // generators
};

// Observers the workers report to (metrics, tests); all optional. They run on the workers'
// threads.
struct WorkerHooks {
  std::function<void(const std::string& model, const BatchEvent&)> on_classify_batch;
  std::function<void(const std::string& model, const DecodeEvent&)> on_decode_step;
};

class Registry {
 public:
  // Loads every model of the manifest (in order) and starts its worker. Fails on the first
  // model that does not load, naming it.
  static absl::StatusOr<std::unique_ptr<Registry>> Load(const std::vector<ModelSpec>& specs,
                                                        const WorkerHooks& hooks = {});
  ~Registry();

  // The model called `name`, or the default of `kind` when name is empty. NOT_FOUND for an
  // unknown name; FAILED_PRECONDITION when it is of another kind.
  absl::StatusOr<ServedModel*> Find(const std::string& name, ModelKind kind) const;
  absl::StatusOr<ServedModel*> FindAny(const std::string& name) const;
  const std::vector<std::unique_ptr<ServedModel>>& models() const { return models_; }

  // Stops every worker: queued and running work ends with UNAVAILABLE / Cancelled.
  void Stop();

 private:
  std::vector<std::unique_ptr<ServedModel>> models_;
};

}  // namespace krause::server
