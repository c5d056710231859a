// The Open Inference Protocol's model repository extension, for both of its front ends, over the
// server's model control (server/core/model_control.h: the same rules as krause.v1's LoadModel,
// UnloadModel and RepositoryIndex, and the same admin tokens):
//   index   every model and version the repository holds (or, without model control, every
//           served one) with its state (LOADING, READY, UNLOADING, UNAVAILABLE, FAILED) and the
//           reason for the last two; `ready` keeps only the READY ones;
//   load    a model's policy versions, or the one a "version" parameter names;
//   unload  the same, the other way.
// Thread-safety: pure functions; StartRepositoryChange's `done` runs on the control thread (or at
// once, for a refusal).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/model_control.h"
#include "server/oip/oip.h"

namespace krause::server::oip {

// A load's or an unload's parameters: "version" (an integer, or its text) and, on an unload,
// "unload_dependents" (a bool: no model here depends on another, so it changes nothing). Any
// other parameter ("config", model files) is InvalidArgument naming it. The version's text, or "".
absl::StatusOr<std::string> RepositoryVersion(const Parameters& parameters, bool unload);

// The index as the REST extension answers it: [{"name", "version", "state", "reason"}, ...].
std::string RepositoryIndexJson(const std::vector<IndexEntry>& entries);

// Loads (or unloads) `model` through `control` (null: FAILED_PRECONDITION, the server has no
// model control); `done` gets the outcome.
void StartRepositoryChange(ModelControl* control, bool load, const std::string& model,
                           const Parameters& parameters, std::function<void(absl::Status)> done);

}  // namespace krause::server::oip
