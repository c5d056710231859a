// A generate body of the HTTP generation (oip_generate.h) read before any model is known: the
// JSON parsed, each setting's type and range checked, unknown names refused. Free of the
// server's types, so that the fuzzer (fuzz/generate_body_fuzz.cc) builds it alone.
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace krause::server::oip {

// A generate body as read, before any model is known: types and ranges checked, unknown names
// refused (InvalidArgument naming the field and what it must be).
struct GenerateBody {
  int64_t num_images = 0;  // 0: 1
  std::optional<uint64_t> seed;
  std::optional<double> temperature, top_p, guidance;
  std::optional<int64_t> top_k;
  std::optional<std::string> label;
  std::optional<int64_t> class_index;
  std::optional<std::string> prompt_png;  // the PNG's bytes
  int64_t prompt_rows = 0;
  int64_t update_interval_ms = 0;  // 0: 100
  std::optional<bool> stream_rows;
  uint64_t first_image = 0;
  int64_t timeout_us = 0;  // 0: the server's deadline
};
absl::StatusOr<GenerateBody> ParseGenerateBody(std::string_view json);

}  // namespace krause::server::oip
