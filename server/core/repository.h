// A versioned model repository on disk, read as plain values (no model is loaded here):
//
//   REPO/<model-name>/config.json               optional: serving options + version policy
//   REPO/<model-name>/<version>/model.safetensors
//
// Versions are positive integers (the folder's name, digits only, no leading zero). config.json
// holds the serving options a manifest entry has (server/core/options.h: batching, limits, device,
// ...) and "version_policy": {"latest": N} (the N newest loadable versions; the default, N = 1) or
// {"specific": [v, ...]} (exactly those). A flat folder of *.safetensors files (the bundled
// models) is not a repository: IsVersionedRepository tells the two layouts apart.
//
// Problems are reported per model and per version, never for the whole repository: a malformed
// config.json, a version folder that is not a positive integer or has no model.safetensors is
// recorded with the file and the reason, so that the rest can still be served.
// Thread-safety: pure functions of the files (ScanRepository reads the folder once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/options.h"

namespace krause::server {

struct VersionPolicy {
  int64_t latest = 1;             // used when `specific` is empty
  std::vector<int64_t> specific;  // non-empty: exactly these versions
};

struct RepositoryVersion {
  int64_t version = 0;
  std::string checkpoint;  // .../<version>/model.safetensors
  // Size and modification time of the checkpoint: a different one means the file changed.
  std::string fingerprint;
  std::string problem;  // non-empty: why this version cannot be loaded (checked before loading)
};

struct RepositoryModel {
  std::string name;
  ModelSpec options;  // config.json's serving options (name and checkpoint unset)
  VersionPolicy policy;
  std::string problem;  // non-empty: config.json is malformed; no version of it is served
  // Size and modification time of config.json ("" without one): its versions reload when it
  // changes.
  std::string config_fingerprint;
  std::vector<RepositoryVersion> versions;  // ascending; entries with a problem included
  // Folders under the model that are not versions ("v2", "01", "-1"), each with why.
  std::vector<std::string> ignored;
};

// A version's text (a folder's name, a request's `version`): digits only, no leading zero,
// 1 .. 2^53.
bool ParseVersion(const std::string& text, int64_t* version);

// True when `dir` holds at least one folder and no *.safetensors file (a repository); false for
// the flat layout.
bool IsVersionedRepository(const std::string& dir);

// Every model folder of the repository (sorted by name), with its config and versions.
// NOT_FOUND when `dir` cannot be read; a model folder whose name is not a valid model name
// ([A-Za-z0-9._-]{1,64}) is listed with that problem.
// `defaults`: the options a model without config.json (or a key config.json leaves out) gets,
// e.g. the --device flag's device.
absl::StatusOr<std::vector<RepositoryModel>> ScanRepository(const std::string& dir,
                                                            const ModelSpec& defaults = {});

// config.json's text as options and policy; InvalidArgument naming `where` and the key.
absl::Status ParseModelConfig(const std::string& json, const std::string& where, ModelSpec* options,
                              VersionPolicy* policy);

// The versions the policy serves among the model's loadable ones (ascending): the newest
// `latest`, or the `specific` ones that exist and have no problem.
std::vector<int64_t> PolicyVersions(const RepositoryModel& model);

// The spec to load one version with: the model's options, its name, the version's checkpoint.
ModelSpec SpecFor(const RepositoryModel& model, const RepositoryVersion& version);

// What to serve at start-up from a repository (--model_control none): every model's policy
// versions. Each model or version that cannot be served is skipped and its reason appended to
// `problems`; NOT_FOUND when nothing at all can be served.
absl::StatusOr<std::vector<ModelSpec>> RepositoryManifest(const std::string& dir,
                                                          const ModelSpec& defaults,
                                                          std::vector<std::string>* problems);

}  // namespace krause::server

namespace krause::server {

// ---- Model control's plan: what to load and unload to bring what is served to what the
// repository says (model_control.h carries it out).

// A version's files as one text: its checkpoint's and its model's config.json's fingerprints.
// A served version whose text differs is reloaded.
std::string VersionFingerprint(const RepositoryModel& model, const RepositoryVersion& version);

struct VersionKey {
  std::string name;
  int64_t version = 0;
  bool operator==(const VersionKey& o) const { return name == o.name && version == o.version; }
  bool operator<(const VersionKey& o) const {
    return name != o.name ? name < o.name : version < o.version;
  }
};
struct ServedVersion {  // served now, loaded from files with this fingerprint
  VersionKey key;
  std::string fingerprint;
};
struct FailedVersion {  // did not load from files with this fingerprint
  VersionKey key;
  std::string fingerprint;
  std::string reason;
};
struct VersionLoad {
  ModelSpec spec;  // name, version, checkpoint, options
  std::string fingerprint;
};
struct RepositoryPlan {
  std::vector<VersionLoad> load;   // by name, then version ascending
  std::vector<VersionKey> unload;  // carried out after every load succeeded
};

// Pure. For every model of `repo` (only the one called `only` when it is not empty):
// - the wanted versions are `version` when it is not 0, else the policy's (PolicyVersions),
//   counting a version that failed to load from the same files as not loadable, unless a copy
//   of it from earlier files serves (a failed reload: that copy stays, nothing is loaded);
// - a wanted version not served, or served from other files, is loaded;
// - with `version` 0 and at least one wanted version, served versions not wanted are unloaded
//   (a model with no loadable version keeps what it serves, as does one whose config.json is
//   malformed);
// - with `only` empty (a poll), a served model whose folder is gone is unloaded.
RepositoryPlan PlanRepository(const std::vector<RepositoryModel>& repo,
                              const std::vector<ServedVersion>& served,
                              const std::vector<FailedVersion>& failed,
                              const std::string& only = "", int64_t version = 0);

}  // namespace krause::server
