// The Open Inference Protocol's gRPC messages (inference/grpc_predict_v2.proto) to and from its
// native types (oip.h). A request's tensors may come raw (raw_input_contents, one entry per input,
// for every input or none) or typed (each input's contents, in the field of its datatype);
// either way they become raw bytes, checked against their datatype and shape. Responses always go
// raw (raw_output_contents), which is what tritonclient's as_numpy reads.
// Thread-safety: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/oip/oip.h"

namespace krause::server::oip {

// InvalidArgument naming the tensor or parameter: an unknown datatype, a parameter without a
// value, raw and typed contents mixed, a raw entry count unlike the inputs', typed contents in a
// field other than the datatype's, or contents that do not fit the shape.
absl::StatusOr<InferRequest> FromProto(const inference::ModelInferRequest& request);
void ToProto(const InferResponse& response, inference::ModelInferResponse* out);
void ToProto(const ModelMetadata& metadata, inference::ModelMetadataResponse* out);

}  // namespace krause::server::oip
