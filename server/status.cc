#include "server/status.h"

#include <string>

#include "absl/strings/cord.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace krause::server {
namespace {

constexpr char kTypePrefix[] = "type.googleapis.com/";

template <typename Message>
std::string TypeUrl() {
  return std::string(kTypePrefix) + Message::descriptor()->full_name();
}

template <typename Message>
void SetDetail(absl::Status* status, const Message& m) {
  status->SetPayload(TypeUrl<Message>(), absl::Cord(m.SerializeAsString()));
}

// ErrorInfo.metadata["model"] = model (the map's wire form: one more key/value entry).
void AddModel(google::rpc::ErrorInfo* e, absl::string_view model) {
  google::rpc::ErrorInfo::MetadataEntry* m = e->add_metadata();
  m->set_key("model");
  m->set_value(std::string(model));
}

// Decodes one detail (type URL and bytes) into `out`; unknown types are skipped.
void Decode(absl::string_view type_url, const std::string& bytes, ErrorDetails* out) {
  if (type_url == TypeUrl<google::rpc::ErrorInfo>()) {
    google::rpc::ErrorInfo e;
    if (!e.ParseFromString(bytes)) return;
    out->reason = e.reason();
    out->domain = e.domain();
    for (const auto& m : e.metadata()) out->metadata.emplace(m.key(), m.value());
  } else if (type_url == TypeUrl<google::rpc::RetryInfo>()) {
    google::rpc::RetryInfo r;
    if (!r.ParseFromString(bytes)) return;
    out->retry_delay = std::chrono::milliseconds(r.retry_delay().seconds() * 1000 +
                                                 r.retry_delay().nanos() / 1000000);
  } else if (type_url == TypeUrl<google::rpc::BadRequest>()) {
    google::rpc::BadRequest b;
    if (!b.ParseFromString(bytes)) return;
    for (const auto& v : b.field_violations()) out->fields.emplace_back(v.field(), v.description());
  }
}

}  // namespace

absl::Status WithErrorInfo(absl::Status status, absl::string_view reason, absl::string_view model,
                           std::optional<std::chrono::milliseconds> retry_delay) {
  if (status.ok()) return status;
  google::rpc::ErrorInfo e;
  e.set_reason(std::string(reason));
  e.set_domain(kErrorDomain);
  if (!model.empty()) AddModel(&e, model);
  SetDetail(&status, e);
  if (retry_delay) {
    google::rpc::RetryInfo r;
    r.mutable_retry_delay()->set_seconds(retry_delay->count() / 1000);
    r.mutable_retry_delay()->set_nanos(static_cast<int32_t>(retry_delay->count() % 1000) * 1000000);
    SetDetail(&status, r);
  }
  return status;
}

absl::Status Refusal(absl::string_view message, absl::string_view reason, absl::string_view model) {
  std::chrono::milliseconds delay = kDrainingRetryDelay;
  if (reason == reason::kQueueFull) delay = kQueueFullRetryDelay;
  if (reason == reason::kModelLoading || reason == reason::kModelUnloaded)
    delay = kLoadingRetryDelay;
  return WithErrorInfo(absl::UnavailableError(message), reason, model, delay);
}

absl::Status WithModel(absl::Status status, absl::string_view model) {
  const std::string url = TypeUrl<google::rpc::ErrorInfo>();
  const absl::optional<absl::Cord> payload = status.GetPayload(url);
  if (!payload || model.empty()) return status;
  google::rpc::ErrorInfo e;
  if (!e.ParseFromString(std::string(*payload))) return status;
  for (const auto& m : e.metadata())
    if (m.key() == "model") return status;
  AddModel(&e, model);
  SetDetail(&status, e);
  return status;
}

absl::Status InvalidField(absl::string_view field, absl::string_view message) {
  return WithField(absl::InvalidArgumentError(message), field);
}

absl::Status WithField(absl::Status status, absl::string_view field) {
  if (status.ok()) return status;
  google::rpc::BadRequest b;
  auto* v = b.add_field_violations();
  v->set_field(std::string(field));
  v->set_description(std::string(status.message()));
  SetDetail(&status, b);
  return status;
}

ErrorDetails DetailsOf(const grpc::Status& status) {
  ErrorDetails d;
  google::rpc::Status s;
  if (status.error_details().empty() || !s.ParseFromString(status.error_details())) return d;
  for (const auto& any : s.details()) Decode(any.type_url(), any.value(), &d);
  return d;
}

ErrorDetails DetailsOf(const absl::Status& status) {
  ErrorDetails d;
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& value) { Decode(url, std::string(value), &d); });
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
    if (url.substr(0, sizeof(kTypePrefix) - 1) != kTypePrefix) return;
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
