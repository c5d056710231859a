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
  // model that does not load, naming it. A name may come more than once with different versions
  // (a repository's policy serving several); `default` is a property of the name.
  // With `failures` (a repository), a model that does not load is skipped and its reason
  // appended there instead; NOT_FOUND when none loads.
  static absl::StatusOr<std::unique_ptr<Registry>> Load(
      const std::vector<ModelSpec>& specs, const WorkerHooks& hooks = {},
      std::vector<std::string>* failures = nullptr);
  ~Registry();

  // The model called `name`, or the default of `kind` when name is empty, at `version` (its
  // decimal text; empty: the newest version served). NOT_FOUND for an unknown name or version;
  // FAILED_PRECONDITION when it is of another kind.
  absl::StatusOr<ServedModel*> Find(const std::string& name, ModelKind kind,
                                    const std::string& version = "") const;
  // The same for a kind's class (ServedClassifier, ServedGenerator).
  template <typename Kind>
  absl::StatusOr<Kind*> Find(const std::string& name, const std::string& version = "") const {
    auto m = Find(name, Kind::kKind, version);
    if (!m.ok()) return m.status();
    return static_cast<Kind*>(*m);
  }
  absl::StatusOr<ServedModel*> FindAny(const std::string& name,
                                       const std::string& version = "") const;
  // Every served version of `name`, ascending (empty when none).
  std::vector<int64_t> Versions(const std::string& name) const;
  const std::vector<std::unique_ptr<ServedModel>>& models() const { return models_; }

  // Stops every worker: queued and running work ends with UNAVAILABLE / Cancelled.
  void Stop();

 private:
  std::vector<std::unique_ptr<ServedModel>> models_;
};

}  // namespace krause::server
