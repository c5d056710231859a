#include "server/core/errors.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/rpc/error_details.pb.h"
#include "server/core/utf8.h"

namespace krause::server {
namespace {

template <typename Message>
std::string TypeUrl() {
  return std::string(kDetailTypePrefix) + Message::descriptor()->full_name();
}

template <typename Message>
void SetDetail(absl::Status* status, const Message& m) {
  status->SetPayload(TypeUrl<Message>(), absl::Cord(m.SerializeAsString()));
}

// ErrorInfo.metadata[key] = value (the map's wire form: one more key/value entry).
void AddMetadata(google::rpc::ErrorInfo* e, absl::string_view key, absl::string_view value) {
  google::rpc::ErrorInfo::MetadataEntry* m = e->add_metadata();
  m->set_key(std::string(key));
  m->set_value(ValidUtf8(value));
}

}  // namespace

void DecodeDetail(absl::string_view type_url, const std::string& bytes, ErrorDetails* out) {
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

absl::Status WithErrorInfo(absl::Status status, absl::string_view reason, absl::string_view model,
                           std::optional<std::chrono::milliseconds> retry_delay) {
  if (status.ok()) return status;
  google::rpc::ErrorInfo e;
  e.set_reason(std::string(reason));
  e.set_domain(kErrorDomain);
  if (!model.empty()) AddMetadata(&e, "model", model);
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
  if (reason == reason::kTenantLimit) delay = kTenantLimitRetryDelay;
  if (reason == reason::kModelLoading || reason == reason::kModelUnloaded)
    delay = kLoadingRetryDelay;
  return WithErrorInfo(absl::UnavailableError(message), reason, model, delay);
}

absl::Status WithModel(absl::Status status, absl::string_view model) {
  return WithMetadata(std::move(status), "model", model);
}

absl::Status WithMetadata(absl::Status status, absl::string_view key, absl::string_view value) {
  const std::string url = TypeUrl<google::rpc::ErrorInfo>();
  const absl::optional<absl::Cord> payload = status.GetPayload(url);
  if (!payload || value.empty()) return status;
  google::rpc::ErrorInfo e;
  if (!e.ParseFromString(std::string(*payload))) return status;
  for (const auto& m : e.metadata())
    if (m.key() == key) return status;
  AddMetadata(&e, key, value);
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
  // A client's text (a field's name, a value quoted in the message) may not be UTF-8, which
  // protobuf's strings must be: other languages' parsers refuse the details otherwise.
  v->set_field(ValidUtf8(field));
  v->set_description(ValidUtf8(status.message()));
  SetDetail(&status, b);
  return status;
}

ErrorDetails DetailsOf(const absl::Status& status) {
  ErrorDetails d;
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& value) {
    DecodeDetail(url, std::string(value), &d);
  });
  return d;
}

absl::Status InternalErrorFor(const char* what, const char* detail) {
  static std::atomic<uint64_t> incidents{0};
  const uint64_t n = ++incidents;
  // One line: the detail's line breaks (a backtrace) folded.
  std::string line(detail == nullptr ? "" : detail);
  for (char& ch : line)
    if (ch == '\n' || ch == '\r') ch = ' ';
  std::fprintf(stderr, "%s krause-server: internal error #%llu in %s: %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone()).c_str(),
               static_cast<unsigned long long>(n), what, line.c_str());
  return absl::InternalError(
      absl::StrCat(what, ": internal error #", n, " (the server's log has the detail)"));
}

}  // namespace krause::server
