#include "server/edge/status.h"

#include <string>

#include "absl/strings/cord.h"
#include "google/rpc/status.pb.h"
#include "server/core/utf8.h"

namespace krause::server {

ErrorDetails DetailsOf(const grpc::Status& status) {
  ErrorDetails d;
  google::rpc::Status s;
  if (status.error_details().empty() || !s.ParseFromString(status.error_details())) return d;
  for (const auto& any : s.details()) DecodeDetail(any.type_url(), any.value(), &d);
  return d;
}

google::rpc::Status RpcStatusOf(const absl::Status& status) {
  google::rpc::Status out;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering 0..16.
  const int code = static_cast<int>(status.code());
  out.set_code(code >= 0 && code <= 16 ? code : static_cast<int>(absl::StatusCode::kUnknown));
  out.set_message(ValidUtf8(status.message()));  // protobuf's strings are UTF-8
  // The payloads (each a google.rpc detail, keyed by its type URL) become its details.
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& value) {
    if (url.substr(0, sizeof(kDetailTypePrefix) - 1) != kDetailTypePrefix) return;
    google::protobuf::Any* any = out.add_details();
    any->set_type_url(std::string(url));
    any->set_value(std::string(value));
  });
  return out;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const google::rpc::Status details = RpcStatusOf(status);
  const auto g = static_cast<grpc::StatusCode>(details.code());
  // The details go in the "grpc-status-details-bin" trailer.
  if (details.details_size() == 0) return grpc::Status(g, details.message());
  return grpc::Status(g, details.message(), details.SerializeAsString());
}

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

const char* CodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return "OK";
    case absl::StatusCode::kCancelled:
      return "CANCELLED";
    case absl::StatusCode::kUnknown:
      return "UNKNOWN";
    case absl::StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case absl::StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case absl::StatusCode::kNotFound:
      return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case absl::StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case absl::StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case absl::StatusCode::kAborted:
      return "ABORTED";
    case absl::StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case absl::StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case absl::StatusCode::kInternal:
      return "INTERNAL";
    case absl::StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case absl::StatusCode::kDataLoss:
      return "DATA_LOSS";
    case absl::StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace krause::server
