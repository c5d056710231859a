// The Open Inference Protocol (KServe v2) in native types, shared by its two front ends (gRPC:
// oip_service.h; REST: oip_http.h) and free of either wire format: requests and responses as
// tensors with names, datatypes, shapes and raw little-endian bytes; parameters; metadata (no
// model or server type here: the fuzzers build it alone). oip_infer.h has each model kind's
// tensor contract (MetadataOf) and runs a request on the served models;
// oip_proto.h and oip_json.h convert the wire formats to and from these types.
//
// The tensor contract (docs/api.md has it with examples):
//   classifier  in:  image UINT8 [-1, H, W, C]  (or BYTES [-1], each element a PNG)
//               out: probabilities FP32 [-1, classes], label BYTES [-1] (the top-1 class name)
//   generator   generating: in: class_index INT32 [N] (optional; -1: none), or parameter
//               num_images; parameters seed, temperature, top_p, top_k, guidance
//               out: images UINT8 [N, H, W, C]
//               scoring: in: image UINT8 [-1, H, W, C], class_index INT32 [n] (optional)
//               out: bits_per_dim FP64 [-1]
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/defaults.h"

namespace krause::server::oip {

// The largest `timeout` parameter (microseconds, as Triton's) an inference accepts.
inline constexpr int64_t kMaxTimeoutMicroseconds = defaults::kMaxTimeoutMicroseconds;

// The protocol's tensor datatypes.
enum class DataType {
  kBool,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kFp32,
  kFp64,
  kBf16,
  kBytes,
};
// "BOOL", "UINT8", ... as the protocol spells them; InvalidArgument naming `field` otherwise.
absl::StatusOr<DataType> ParseDataType(absl::string_view name, absl::string_view field);
const char* DataTypeName(DataType type);
// Bytes per element; 0 for BYTES (variable-length elements).
int64_t ElementBytes(DataType type);

// A parameter's value: the protocol's oneof.
using Parameter = std::variant<bool, int64_t, uint64_t, double, std::string>;
using Parameters = std::map<std::string, Parameter>;

// A tensor with its elements as the protocol's raw form: little-endian, row-major, no padding;
// a BYTES element is a 4-byte little-endian length, then its bytes.
struct Tensor {
  std::string name;
  DataType datatype = DataType::kUint8;
  std::vector<int64_t> shape;
  std::string data;
};

// The product of a shape's dimensions; InvalidArgument naming `field` for a negative dimension
// or a product over 2^40.
absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape, absl::string_view field);
// A tensor's raw bytes agree with its datatype and shape (numbers: count x size; BYTES: exactly
// count well-formed elements). InvalidArgument naming the tensor, what it has and what it needs.
absl::Status CheckContents(const Tensor& t);
// The BYTES elements of a checked tensor (views into t.data).
std::vector<std::string_view> BytesElements(const Tensor& t);
// Appends one BYTES element in the raw form.
void AppendBytesElement(std::string_view element, std::string* data);
// "[1, 28, 28, 1]", for messages.
std::string ShapeString(const std::vector<int64_t>& shape);

// An output a request asks for, with its parameters: "classification" (the classification
// extension: the top k classes instead of the tensor, both front ends); "binary_data" (the
// binary tensor data extension, REST: its front end takes it out before the inference).
struct RequestedOutput {
  std::string name;
  Parameters parameters;
};

struct InferRequest {
  std::string model;    // model_name
  std::string version;  // model_version; empty: the served one
  std::string id;
  Parameters parameters;
  std::vector<Tensor> inputs;
  std::vector<RequestedOutput> outputs;  // requested outputs; empty: all of the model's
};

struct InferResponse {
  std::string model, version, id;
  std::vector<Tensor> outputs;
};

struct TensorSpec {
  std::string name;
  DataType datatype = DataType::kUint8;
  std::vector<int64_t> shape;  // -1: any size
};

struct ModelMetadata {
  std::string name;
  std::vector<std::string> versions;
  std::string platform;
  std::vector<TensorSpec> inputs, outputs;
};

// The extensions /v2 and ServerMetadata list (only those implemented).
std::vector<std::string> Extensions();
inline constexpr char kServerName[] = "krause-serve";
const char* ServerVersion();  // the project version it was built as

// A parameter as a number: int64, uint64 or double (a double must be whole for an integer).
// InvalidArgument naming `name` and what it has otherwise.
absl::StatusOr<double> NumberParameter(const std::string& name, const Parameter& p);
absl::StatusOr<int64_t> IntegerParameter(const std::string& name, const Parameter& p);
// "bool", "int64", "uint64", "double", "string".
const char* ParameterTypeName(const Parameter& p);

}  // namespace krause::server::oip
