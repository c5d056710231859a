#include "server/edge/status.h"

#include <string>

#include "absl/strings/cord.h"
#include "google/rpc/status.pb.h"

namespace krause::server {

ErrorDetails DetailsOf(const grpc::Status& status) {
  ErrorDetails d;
  google::rpc::Status s;
  if (status.error_details().empty() || !s.ParseFromString(status.error_details())) return d;
  for (const auto& any : s.details()) DecodeDetail(any.type_url(), any.value(), &d);
  return d;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering 0..16.
  const int code = static_cast<int>(status.code());
  const grpc::StatusCode g =
      (code >= 0 && code <= 16) ? static_cast<grpc::StatusCode>(code) : grpc::StatusCode::UNKNOWN;
  std::string message(status.message());
  // The payloads (each a google.rpc detail, keyed by its type URL) become google.rpc.Status's
  // details, which gRPC sends in the "grpc-status-details-bin" trailer.
  google::rpc::Status details;
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& value) {
    if (url.substr(0, sizeof(kDetailTypePrefix) - 1) != kDetailTypePrefix) return;
    google::protobuf::Any* any = details.add_details();
    any->set_type_url(std::string(url));
    any->set_value(std::string(value));
  });
  if (details.details_size() == 0) return grpc::Status(g, std::move(message));
  details.set_code(static_cast<int32_t>(g));
  details.set_message(message);
  return grpc::Status(g, std::move(message), details.SerializeAsString());
}

int HttpStatus(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
      return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace krause::server
