// The one place where absl::Status becomes grpc::Status (codes map one to one; the message is
// kept). Thread-safety: pure functions.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace krause::server {

grpc::Status ToGrpcStatus(const absl::Status& status);
// The gRPC code's canonical name ("OK", "INVALID_ARGUMENT", ...), for logs and metrics labels.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace krause::server
