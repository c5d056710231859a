// krause-client's flags, defined in client/main.cc (where --help lists them), declared here for
// the subcommands' files (client/commands_*.cc).
#pragma once

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, model_version);
ABSL_DECLARE_FLAG(std::string, service);
ABSL_DECLARE_FLAG(std::string, index);
ABSL_DECLARE_FLAG(int32_t, top);
ABSL_DECLARE_FLAG(int32_t, priority);
ABSL_DECLARE_FLAG(int32_t, batch);
ABSL_DECLARE_FLAG(std::string, label);
ABSL_DECLARE_FLAG(int32_t, class_index);
ABSL_DECLARE_FLAG(std::string, labels_file);
ABSL_DECLARE_FLAG(double, guidance);
ABSL_DECLARE_FLAG(int32_t, num);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(int32_t, rows);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, prefix);
ABSL_DECLARE_FLAG(std::string, layer);
ABSL_DECLARE_FLAG(std::string, head);
ABSL_DECLARE_FLAG(std::string, query);
ABSL_DECLARE_FLAG(bool, summary);
ABSL_DECLARE_FLAG(bool, progress);
ABSL_DECLARE_FLAG(bool, resume);
ABSL_DECLARE_FLAG(int32_t, max_resumes);
ABSL_DECLARE_FLAG(double, attempt_timeout);
