// The model registry: (name, version) -> served model (served_model.h: one interface, a class
// per kind), built from the manifest through the table of kinds in registry.cc, and changed
// while serving by model control (model_control.h): Install() adds or replaces a version,
// Remove() takes one out.
//
// Lookups hand out shared references: a call holds its model's reference until its reply is
// done, so a version that is replaced or removed keeps serving the calls that started on it.
// A removed version is kept in a retiring list until nothing else refers to it; Collect() (model
// control's thread) then stops its worker and frees it there, never on a worker's or a call's
// thread. Freed versions are remembered (the most recent 64) so that their gauges read 0.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/engine/kernel_check.h"
#include "server/core/model_info.h"
#include "server/core/options.h"
#include "server/core/served_model.h"

namespace krause::server {

using ModelRef = std::shared_ptr<ServedModel>;

class Registry {
 public:
  // Loads every model of the manifest (in order) and starts its worker. Fails on the first
  // model that does not load, naming it. A name may come more than once with different versions
  // (a repository's policy serving several); `default` is a property of the name.
  // With `failures` (a repository), a model that does not load is skipped and its reason
  // appended there instead; NOT_FOUND when none loads unless `allow_empty` (model control can
  // load models later).
  static absl::StatusOr<std::unique_ptr<Registry>> Load(
      const std::vector<ModelSpec>& specs, const WorkerHooks& hooks = {},
      std::vector<std::string>* failures = nullptr, bool allow_empty = false);
  // One model loaded from its checkpoint with its worker started, not yet served. Before the
  // worker starts, the load-time kernel check (Check) picks the implementation it serves on;
  // the model's info tells which and every check tried. FAILED_PRECONDITION naming the model,
  // each implementation tried and why it failed when none passes (or, with --kernel_check=strict,
  // when the first fails).
  static absl::StatusOr<ModelRef> Build(const ModelSpec& spec, const WorkerHooks& hooks);

  // The kernel check of a model loaded for `spec` (model/engine/kernel_check.h): the
  // implementations of ServingChain(spec.device, spec.attention_impl) in order, each against the
  // reference on the CPU (a CPU copy loaded when the model is on a GPU), the first that passes
  // chosen (the first unchecked with KernelCheckMode::kOff).
  struct Checked {
    ServingChoice choice;
    std::vector<KernelCheckRecord> checks;  // one per implementation tried, in order
    std::optional<LoadedModel> moved;       // the model on the CPU when the choice moved it there
  };
  static absl::StatusOr<Checked> Check(const ModelSpec& spec, const LoadedModel& loaded);
  Registry() = default;
  ~Registry();

  // Serves `model` at its name and version from the next lookup on; a version already served
  // under that name and number is retired (its calls finish on it). InvalidArgument when the
  // name's other versions are of another kind, or `default` would give a kind a second default.
  absl::Status Install(ModelRef model);
  // Stops serving `name` at `version` (0: every version); calls in flight finish on it.
  // NOT_FOUND when nothing of that is served. Once no version of a name is left, lookups of the
  // name get UNAVAILABLE (until a version is installed again).
  absl::Status Remove(const std::string& name, int64_t version);
  // Stops and frees the retired models nothing refers to any more; returns how many are left.
  size_t Collect();

  // The model called `name`, or the default of `kind` when name is empty, at `version` (its
  // decimal text; empty: the newest version served). NOT_FOUND for an unknown name or version;
  // UNAVAILABLE for a name whose versions were all removed; FAILED_PRECONDITION when it is of
  // another kind.
  absl::StatusOr<ModelRef> Find(const std::string& name, ModelKind kind,
                                const std::string& version = "") const;
  // The same for a kind's class (ServedClassifier, ServedGenerator).
  template <typename Kind>
  absl::StatusOr<std::shared_ptr<Kind>> Find(const std::string& name,
                                             const std::string& version = "") const {
    auto m = Find(name, Kind::kKind, version);
    if (!m.ok()) return m.status();
    return std::static_pointer_cast<Kind>(*std::move(m));
  }
  absl::StatusOr<ModelRef> FindAny(const std::string& name, const std::string& version = "") const;
  // Every served version of `name`, ascending (empty when none).
  std::vector<int64_t> Versions(const std::string& name) const;
  // The served models now: each name's versions together, ascending.
  std::vector<ModelRef> models() const;

  // For the gauges: the retired models still finishing calls, and the freed ones (name,
  // version, kind) whose gauges read 0.
  struct Freed {
    std::string name;
    int64_t version = 0;
    ModelKind kind = ModelKind::kClassifier;
  };
  std::vector<ModelRef> retiring() const;
  std::vector<Freed> freed() const;

  // Stops every worker (served and retiring): queued and running work ends with UNAVAILABLE /
  // Cancelled.
  void Stop();

 private:
  using Table = std::vector<ModelRef>;
  std::shared_ptr<const Table> table() const;
  // The table with `change` applied, checked; mu_ held.
  absl::Status CheckAgainst(const Table& table, const ServedModel& model) const;

  mutable std::mutex mu_;
  std::shared_ptr<const Table> table_ = std::make_shared<Table>();
  std::vector<ModelRef> retiring_;
  std::vector<Freed> freed_;
  std::set<std::string> removed_names_;  // every version removed: UNAVAILABLE, not NOT_FOUND
};

}  // namespace krause::server
