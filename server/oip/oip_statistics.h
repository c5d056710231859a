// The Open Inference Protocol's statistics extension for both of its front ends: the figures of
// server/edge/model_stats.h for the served model versions a request names (every model, every
// version of one, or one version).
// Thread-safety: pure functions over thread-safe objects.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/registry.h"
#include "server/edge/model_stats.h"

namespace krause::server::oip {

// `name` empty: every served model version; else the served versions of `name`, or the one
// `version` names. NOT_FOUND for a model or version not served.
absl::StatusOr<std::vector<ModelStats>> StatisticsOf(const Registry& registry,
                                                     const StatsBook& book, const std::string& name,
                                                     const std::string& version);

// {"model_stats": [...]}, the extension's REST answer.
std::string StatisticsJson(const std::vector<ModelStats>& stats);

}  // namespace krause::server::oip
