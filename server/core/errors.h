// The errors a call can end with, in absl::Status: the reasons a call is refused and their retry
// delays, and the google.rpc details a status carries as payloads (ErrorInfo, RetryInfo,
// BadRequest), made and read here without any wire format; edge/status.h turns them into gRPC's
// and HTTP's. Guarded: the barrier every handler body and reply runs behind.
// Thread-safety: pure functions (Guarded's log line aside).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
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
inline constexpr char kTenantLimit[] = "TENANT_LIMIT";      // RESOURCE_EXHAUSTED: the tenant's own
                                                            // limit; back off (others are served)
}  // namespace reason

// The suggested delay before retrying, per reason (google.rpc.RetryInfo.retry_delay).
inline constexpr std::chrono::milliseconds kQueueFullRetryDelay{250};
inline constexpr std::chrono::milliseconds kDrainingRetryDelay{0};
inline constexpr std::chrono::milliseconds kLoadingRetryDelay{1000};
inline constexpr std::chrono::milliseconds kTenantLimitRetryDelay{100};

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
// `status` with metadata `key` = `value` added to its ErrorInfo, when it has one without that key.
absl::Status WithMetadata(absl::Status status, absl::string_view key, absl::string_view value);
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
ErrorDetails DetailsOf(const absl::Status& status);
// Decodes one google.rpc detail (its type URL and serialized bytes) into `out`; unknown types
// are skipped.
void DecodeDetail(absl::string_view type_url, const std::string& bytes, ErrorDetails* out);
// The type URL prefix of the details ("type.googleapis.com/").
inline constexpr char kDetailTypePrefix[] = "type.googleapis.com/";

// An exception that escaped a call's code, made safe for the client: the detail (the exception's
// text, which may hold a library's backtrace) goes to the server's log on one line with an
// incident number, and the client gets INTERNAL "`what`: internal error #N (the server's log has
// the detail)".
absl::Status InternalErrorFor(const char* what, const char* detail);

// The barrier around every handler body and every reply built for a call: runs `body` (returning
// absl::Status) and turns any exception it throws into INTERNAL naming `what` (InternalErrorFor),
// so that a call always ends with a status and leaves the gate.
template <typename F>
absl::Status Guarded(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return InternalErrorFor(what, e.what());
  } catch (...) {
    return InternalErrorFor(what, "unknown exception");
  }
}

}  // namespace krause::server
