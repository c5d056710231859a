// A JSON request's fields read with the checks every HTTP front end's parser makes (the HTTP
// generation's body, v1/generate_body.h; OpenAI's image request, openai/images_request.h): the
// type, then the range, each error InvalidArgument naming the field ("top_k must be in [0,
// 2147483647], got -1"). Header-only, so that the fuzzers' parsers build it alone.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/core/errors.h"
#include "server/edge/json_text.h"

namespace krause::server {

// InvalidArgument naming `field`: "<field> <what>".
inline absl::Status BadField(absl::string_view field, absl::string_view what) {
  return InvalidField(field, absl::StrCat(field, " ", what));
}

// A JSON integer in [lo, hi].
inline absl::StatusOr<int64_t> JsonIntegerIn(const nlohmann::json& j, absl::string_view field,
                                             int64_t lo, int64_t hi) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(u) >= lo)
      return static_cast<int64_t>(u);
  } else if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v >= lo && v <= hi) return v;
  } else {
    return BadField(field, "must be an integer");
  }
  return BadField(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", JsonText(j)));
}

// A JSON integer >= 0 (a seed: all of uint64).
inline absl::StatusOr<uint64_t> JsonUnsigned(const nlohmann::json& j, absl::string_view field) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer())
    return BadField(field, absl::StrCat("must be >= 0, got ", JsonText(j)));
  return BadField(field, "must be an integer");
}

inline absl::StatusOr<double> JsonNumber(const nlohmann::json& j, absl::string_view field) {
  if (!j.is_number()) return BadField(field, "must be a number");
  return j.get<double>();
}

inline absl::StatusOr<std::string> JsonString(const nlohmann::json& j, absl::string_view field) {
  if (!j.is_string()) return BadField(field, "must be a string");
  return j.get<std::string>();
}

}  // namespace krause::server
