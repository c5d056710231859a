#include "server/edge/request_log.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace krause::server {

std::string FormatCallRecord(const CallRecord& r, absl::Time now) {
  nlohmann::ordered_json j;
  j["time"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", now, absl::UTCTimeZone());
  j["rpc"] = r.rpc;
  j["protocol"] = r.protocol;
  j["model"] = r.model;
  j["version"] = r.version;
  j["code"] = r.code;
  j["images"] = r.images;
  j["seconds"] = r.seconds;
  j["queue_seconds"] = r.queue_seconds;
  j["run_seconds"] = std::max(0.0, r.seconds - r.queue_seconds);
  j["peer"] = r.peer;
  if (!r.tenant.empty()) j["tenant"] = r.tenant;
  if (!r.request_id.empty()) j["request_id"] = r.request_id;
  if (!r.traceparent.empty()) j["traceparent"] = r.traceparent;
  // Metadata is client input: invalid UTF-8 is replaced, never thrown on.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<std::unique_ptr<RequestLog>> RequestLog::Open(const std::string& path) {
  if (path == "-") return std::unique_ptr<RequestLog>(new RequestLog(stderr, false));
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat("--request_log ", path, ": ", std::strerror(errno)));
  return std::unique_ptr<RequestLog>(new RequestLog(f, true));
}

RequestLog::~RequestLog() {
  if (owned_) std::fclose(f_);
}

void RequestLog::Write(const CallRecord& r) {
  const std::string line = FormatCallRecord(r, absl::Now()) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);
}

}  // namespace krause::server
