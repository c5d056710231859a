// --help for the project's binaries. Abseil's --help lists only the flags defined in a file named
// like the program (krause-server.cc, krause-server_main.cc); ours live in files such as
// server/main.cc, so --help printed the usage text and "No flags matched". ShowOwnFlagsInHelp()
// makes --help and --helpshort list every flag not defined by Abseil itself, each with its
// default. Call it before absl::ParseCommandLine.
#pragma once

#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace krause {

inline void ShowOwnFlagsInHelp() {
  absl::FlagsUsageConfig config;
  const auto ours = [](absl::string_view file) { return !absl::StrContains(file, "absl/"); };
  config.contains_help_flags = ours;
  config.contains_helpshort_flags = ours;
  // "Flags from server/main.cc", not the build machine's absolute path.
  config.normalize_filename = [](absl::string_view file) {
    for (absl::string_view root : {"/server/", "/client/", "/model/", "/tools/"}) {
      const size_t at = file.rfind(root);
      if (at != absl::string_view::npos) return std::string(file.substr(at + 1));
    }
    return std::string(file);
  };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace krause
