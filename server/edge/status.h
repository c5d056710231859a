// The one place where absl::Status becomes grpc::Status (codes map one to one; the message is
// kept, and the status's error details travel as a google.rpc.Status in the call's
// "grpc-status-details-bin" trailer), the details read back from a grpc::Status, and a code's
// name and HTTP status. The errors themselves are made in core/errors.h.
// Thread-safety: pure functions.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "google/rpc/status.pb.h"
#include "server/core/errors.h"

namespace krause::server {

// A grpc::Status's details (core/errors.h's DetailsOf reads an absl::Status's).
ErrorDetails DetailsOf(const grpc::Status& status);

// The status as google.rpc.Status: its code, message and each detail (ErrorInfo, RetryInfo,
// BadRequest) as an Any (what gRPC's trailer and Connect's error body carry).
google::rpc::Status RpcStatusOf(const absl::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);
// The HTTP status of a code (the Open Inference Protocol's REST API): 400 bad request
// (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE), 401 UNAUTHENTICATED, 403
// PERMISSION_DENIED, 404 NOT_FOUND, 409 ALREADY_EXISTS / ABORTED, 429 RESOURCE_EXHAUSTED, 499
// CANCELLED, 501 UNIMPLEMENTED, 503 UNAVAILABLE (not ready, draining, queue full), 504
// DEADLINE_EXCEEDED, else 500.
int HttpStatus(absl::StatusCode code);

// The code's canonical name, gRPC's ("OK", "INVALID_ARGUMENT", ...), for logs, metrics labels
// and the HTTP protocols' error bodies.
const char* CodeName(absl::StatusCode code);
// The same for a gRPC code (the clients').
inline const char* GrpcCodeName(grpc::StatusCode code) {
  return CodeName(static_cast<absl::StatusCode>(code));
}

}  // namespace krause::server
