// The one place where absl::Status becomes grpc::Status (codes map one to one; the message is
// kept, and the status's error details travel as a google.rpc.Status in the call's
// "grpc-status-details-bin" trailer), plus the makers and readers of those details.
// Thread-safety: pure functions.
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace krause::server {

// google.rpc.ErrorInfo's domain for every reason below.
inline constexpr char kErrorDomain[] = "krause-serve";

// The reasons a call is refused (google.rpc.ErrorInfo.reason); docs/api.md "Errors a program
// can act on" says what a client should do with each.
namespace reason {
inline constexpr char kQueueFull[] = "QUEUE_FULL";          // UNAVAILABLE: back off, then retry
inline constexpr char kDraining[] = "DRAINING";             // UNAVAILABLE: retry elsewhere at once
inline constexpr char kModelLoading[] = "MODEL_LOADING";    // UNAVAILABLE: models not loaded yet
inline constexpr char kModelUnloaded[] = "MODEL_UNLOADED";  // UNAVAILABLE: no version served now
}  // namespace reason

// The suggested delay before retrying, per reason (google.rpc.RetryInfo.retry_delay).
inline constexpr std::chrono::milliseconds kQueueFullRetryDelay{250};
inline constexpr std::chrono::milliseconds kDrainingRetryDelay{0};
inline constexpr std::chrono::milliseconds kLoadingRetryDelay{1000};

// `status` with a google.rpc.ErrorInfo {reason, domain kErrorDomain, metadata {"model": model}
// when `model` is not empty} and, when `retry_delay` is set, a google.rpc.RetryInfo.
absl::Status WithErrorInfo(absl::Status status, absl::string_view reason, absl::string_view model,
                           std::optional<std::chrono::milliseconds> retry_delay);
// UNAVAILABLE `message` with its reason, the model and the reason's retry delay.
absl::Status Refusal(absl::string_view message, absl::string_view reason,
                     absl::string_view model = "");
// `status` with metadata "model" added to its ErrorInfo, when it has one without a model (the
// call's book knows the model; the queue that refused the call does not).
absl::Status WithModel(absl::Status status, absl::string_view model);
// INVALID_ARGUMENT `message` with a google.rpc.BadRequest naming `field` (a path into the
// request: "num_images", "images[2].raw.pixels"); the message is kept as written.
absl::Status InvalidField(absl::string_view field, absl::string_view message);
// The same status with `field` as the BadRequest's field (a status without one gains it).
absl::Status WithField(absl::Status status, absl::string_view field);

// A failed call's error details, decoded (from a grpc::Status's binary details, or from an
// absl::Status's payloads): what a client acts on.
struct ErrorDetails {
  std::string reason, domain;                               // ErrorInfo; empty when absent
  std::map<std::string, std::string> metadata;              // ErrorInfo.metadata
  std::optional<std::chrono::milliseconds> retry_delay;     // RetryInfo
  std::vector<std::pair<std::string, std::string>> fields;  // BadRequest: (field, description)
};
ErrorDetails DetailsOf(const grpc::Status& status);
ErrorDetails DetailsOf(const absl::Status& status);

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
