// Model control: a versioned repository's models loaded, reloaded and unloaded while the server
// serves (--model_control none|poll|explicit, the names Triton's users know).
//
// Every mode loads the repository's policy versions at start-up. `poll` rescans the repository
// every --repository_poll_s and applies what changed (a new, changed or removed version folder,
// a changed config.json); `explicit` changes only on LoadModel / UnloadModel; `none` never
// changes. The plan is a pure function (repository.h: PlanRepository); this class carries it
// out on its own thread, one operation at a time (a second LoadModel waits for the first):
// a version is loaded, warmed (ServedModel::WarmUp) and checked off the serving path, then
// installed in the registry, where new calls find it at once; versions it replaces are then
// removed, and the registry frees each after its last call (Registry::Collect, on this thread).
// A version that fails is FAILED with its reason and changes nothing that serves; a poll does
// not retry it until its files change.
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/registry.h"
#include "server/core/repository.h"

namespace krause::server {

enum class ModelControlMode { kNone, kPoll, kExplicit };
absl::StatusOr<ModelControlMode> ParseModelControlMode(absl::string_view text);
const char* ModelControlModeName(ModelControlMode mode);

enum class VersionState { kLoading, kReady, kUnloading, kUnavailable, kFailed };
const char* VersionStateName(VersionState state);

struct IndexEntry {
  std::string name;
  int64_t version = 0;  // 0: the model as a whole (a malformed config.json)
  VersionState state = VersionState::kUnavailable;
  std::string reason;  // why UNAVAILABLE or FAILED
};

// What every model-control front end answers for an index: the repository's (`control`), or,
// on a server without model control, the served models, each READY (nothing can change them).
std::vector<IndexEntry> IndexOf(const class ModelControl* control, const Registry& registry,
                                bool ready_only);
// FAILED_PRECONDITION for a load or unload (`rpc`) on a server without model control.
absl::Status NoModelControl(absl::string_view rpc);

struct ModelControlOptions {
  ModelControlMode mode = ModelControlMode::kNone;
  std::string repository;    // the versioned repository (--models_dir)
  double poll_seconds = 10;  // kPoll: seconds between scans
  // kExplicit: the models loaded at start-up ("*": every model); none named: none (Triton's
  // --load-model). Other modes load every model and take no list.
  std::vector<std::string> load_at_start;
  ModelSpec defaults;  // options of a model without config.json (the --device flag's)
  WorkerHooks hooks;   // the models' workers report to these
  std::function<void(const std::string&)> log;  // one line per change (may be empty)
};

class ModelControl {
 public:
  // Loads every model's policy versions into `registry` (explicit mode: those of the models
  // load_at_start names) on the calling thread, then starts the control thread. InvalidArgument
  // for a bad option; NOT_FOUND when the repository cannot be read, when load_at_start names a
  // model it lacks, or with mode none when no version loads (nothing could ever serve).
  static absl::StatusOr<std::unique_ptr<ModelControl>> Start(ModelControlOptions options,
                                                             Registry* registry);
  ~ModelControl();  // Stop()
  // Ends the control thread: queued operations get UNAVAILABLE. The registry is the caller's.
  void Stop();

  ModelControlMode mode() const { return options_.mode; }

  // The model's versions after the operation, or why it failed (model_control above and
  // LoadModel/UnloadModel in proto/krause/v1/krause.proto). `version`: its decimal text, or
  // empty. `done` runs on the control thread (or at once, for a refusal).
  using Done = std::function<void(absl::StatusOr<std::vector<IndexEntry>>)>;
  void Load(const std::string& name, const std::string& version, Done done);
  void Unload(const std::string& name, const std::string& version, Done done);
  // Every model and version of the repository and every served one, by name then version.
  std::vector<IndexEntry> Index(bool ready_only = false) const;
  // Runs a poll now (as the timer would, in any mode) and returns when it is done (tests).
  void PollNow();

 private:
  ModelControl(ModelControlOptions options, Registry* registry);
  void Loop();
  void Post(std::function<void()> op);
  // Loads and unloads what the plan for `only` (every model when empty) at `version` says;
  // on the control thread. OK, or the failed versions' reasons; NOT_FOUND/INVALID_ARGUMENT for
  // a name or version the repository does not have.
  absl::Status Apply(const std::string& only, int64_t version, bool retry_failed);
  absl::Status LoadVersion(const VersionLoad& load);
  std::vector<IndexEntry> EntriesOf(const std::string& name) const;
  void Log(const std::string& line) const;

  const ModelControlOptions options_;
  Registry* const registry_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> ops_;
  bool stop_ = false;
  // Guarded by mu_ (written on the control thread, read by Index).
  std::map<VersionKey, std::string> fingerprints_;  // served versions' files
  std::vector<FailedVersion> failed_;
  std::set<VersionKey> loading_;
  std::map<VersionKey, std::string> unloaded_;  // why (UnloadModel, a poll)
  std::thread thread_;
};

}  // namespace krause::server
