// The Open Inference Protocol's REST JSON to and from its native types (oip.h), on
// nlohmann-json. An input's "data" may be flat or nested row-major arrays (nesting is not checked
// against the shape: the element count is); each element must be a JSON value of the datatype
// (true/false for BOOL, integers within the type's range, numbers for FP16/FP32/FP64 (FP16 and
// BF16: not accepted in JSON), strings for BYTES). Responses carry each output's "data" flat.
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/oip/oip.h"

namespace krause::server::oip {

// The binary tensor data extension's header: the length of the JSON at the start of a body whose
// binary tensor data follows it.
inline constexpr char kInferenceHeaderLength[] = "Inference-Header-Content-Length";

// A POST .../infer body for `model` at `version` (from the path). InvalidArgument naming the
// field for malformed JSON, a missing or mistyped field, an unknown datatype, a parameter that is
// not a bool, number or string, data that does not fit its datatype or shape.
// The binary tensor data extension: with `header_length` (the Inference-Header-Content-Length
// header's value) the JSON is the body's first header_length bytes, and each input with a
// binary_data_size parameter (instead of "data") takes that many bytes of what follows, in the
// inputs' order (the raw form: little-endian, BYTES elements length-prefixed); a length past the
// body, a size past what is left, bytes that no input takes: InvalidArgument naming them.
absl::StatusOr<InferRequest> ParseInferJson(
    absl::string_view body, const std::string& model, const std::string& version,
    std::optional<absl::string_view> header_length = std::nullopt);

// Which outputs a REST response sends as binary data: an output's binary_data parameter, else the
// request's binary_data_output (both false when absent).
struct BinaryOutputs {
  bool all = false;
  std::map<std::string, bool> per_output;
  bool Of(const std::string& output) const;
};
// Reads those parameters and takes them out of the request (the inference sees no transport
// parameter); InvalidArgument when one is not a bool.
absl::StatusOr<BinaryOutputs> TakeBinaryOutputs(InferRequest* request);

// A response's body: the JSON, then the binary outputs' bytes in the outputs' order; with any
// binary output, json_length is the JSON's length (the Inference-Header-Content-Length header),
// else -1.
struct InferResponseBody {
  std::string body;
  int64_t json_length = -1;
};
InferResponseBody ResponseBodyOf(const InferResponse& response, const BinaryOutputs& binary);
std::string InferResponseJson(const InferResponse& response);  // every output as JSON data
// The model repository extension's bodies: an index's {"ready": bool} (its `ready`), a load's or
// an unload's {"parameters": {...}}; an empty body is {}. InvalidArgument naming what is wrong.
absl::StatusOr<bool> ParseRepositoryIndexJson(absl::string_view body);
absl::StatusOr<Parameters> ParseRepositoryChangeJson(absl::string_view body);
std::string ModelMetadataJson(const ModelMetadata& metadata);
std::string ServerMetadataJson();

}  // namespace krause::server::oip
