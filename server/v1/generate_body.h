// The HTTP generation's JSON body (v1/http_generation.h) as a generation's settings
// (core/generate_settings.h), read before any model is known: the JSON parsed, each setting's
// type and range checked, unknown names refused. The settings carry krause.v1 GenerateRequest's
// names; each is mapped to its setting here and nowhere else. Free of the server's types, so
// that the fuzzer (fuzz/generate_body_fuzz.cc) builds it alone.
// Thread-safety: a pure function.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "server/core/generate_settings.h"

namespace krause::server {

// InvalidArgument naming the field and what it must be. Settings may also sit in a
// "parameters" object (the generate extension's habit), but not in both places.
absl::StatusOr<GenerateSettings> ParseGenerateBody(std::string_view json);

}  // namespace krause::server
