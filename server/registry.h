// The model registry: name -> served model (served_model.h: one interface, a class per kind),
// built from the manifest through the table of kinds in registry.cc.
// Thread-safety: built once, then read-only (the models' workers are thread-safe); Stop() once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/model_info.h"
#include "server/options.h"
#include "server/served_model.h"

namespace krause::server {

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
  // The same for a kind's class (ServedClassifier, ServedGenerator).
  template <typename Kind>
  absl::StatusOr<Kind*> Find(const std::string& name) const {
    auto m = Find(name, Kind::kKind);
    if (!m.ok()) return m.status();
    return static_cast<Kind*>(*m);
  }
  absl::StatusOr<ServedModel*> FindAny(const std::string& name) const;
  const std::vector<std::unique_ptr<ServedModel>>& models() const { return models_; }

  // Stops every worker: queued and running work ends with UNAVAILABLE / Cancelled.
  void Stop();

 private:
  std::vector<std::unique_ptr<ServedModel>> models_;
};

}  // namespace krause::server
