// Whole-file reads shared by the model code, the server and the clients.
// Thread-safety: free functions.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace krause {

// The bytes of `path`; NotFound("PATH: cannot open") when it cannot be opened.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace krause
