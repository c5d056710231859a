// The Open Inference Protocol's REST JSON to and from its native types (oip.h), on
// nlohmann-json. An input's "data" may be flat or nested row-major arrays (nesting is not checked
// against the shape: the element count is); each element must be a JSON value of the datatype
// (true/false for BOOL, integers within the type's range, numbers for FP16/FP32/FP64 (FP16 and
// BF16: not accepted in JSON), strings for BYTES). Responses carry each output's "data" flat.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/oip/oip.h"

namespace krause::server::oip {

// A POST .../infer body for `model` at `version` (from the path). InvalidArgument naming the
// field for malformed JSON, a missing or mistyped field, an unknown datatype, a parameter that is
// not a bool, number or string, data that does not fit its datatype or shape, and the binary
// tensor extension's parameters (not supported).
absl::StatusOr<InferRequest> ParseInferJson(absl::string_view body, const std::string& model,
                                            const std::string& version);
std::string InferResponseJson(const InferResponse& response);
std::string ModelMetadataJson(const ModelMetadata& metadata);
std::string ServerMetadataJson();
// {"error": "<message>"}
std::string ErrorJson(absl::string_view message);

}  // namespace krause::server::oip
