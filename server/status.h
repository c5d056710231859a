// The one place where absl::Status becomes grpc::Status (codes map one to one; the message is
// kept). Thread-safety: pure functions.
#pragma once

#include <grpcpp/support/status.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace krause::server {

grpc::Status ToGrpcStatus(const absl::Status& status);
// The HTTP status of a gRPC code (the Open Inference Protocol's REST API): 400 bad request
// (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE), 401 UNAUTHENTICATED, 403
// PERMISSION_DENIED, 404 NOT_FOUND, 409 ALREADY_EXISTS / ABORTED, 429 RESOURCE_EXHAUSTED, 499
// CANCELLED, 501 UNIMPLEMENTED, 503 UNAVAILABLE (not ready, draining, queue full), 504
// DEADLINE_EXCEEDED, else 500.
int HttpStatus(grpc::StatusCode code);

// The gRPC code's canonical name ("OK", "INVALID_ARGUMENT", ...), for logs and metrics labels.
const char* GrpcCodeName(grpc::StatusCode code);

// The barrier around every handler body and every reply built for a call: runs `body` (returning
// absl::Status) and turns any exception it throws into INTERNAL naming `what` and the exception,
// so that a call always ends with a status and leaves the gate.
template <typename F>
absl::Status Guarded(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": internal error: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": internal error (unknown exception)"));
  }
}

}  // namespace krause::server
