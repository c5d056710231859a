// Request logs: one JSON line per finished call (--request_log FILE, "-" for stderr), for an
// operator to grep, ship to a log store, or join with a trace by the caller's ids.
//
//   {"time":"2026-12-01T21:40:00.123Z","rpc":"Classify","model":"krause-vit-fmnist",
//    "code":"OK","images":4,"seconds":0.0031,"queue_seconds":0.0004,"run_seconds":0.0027,
//    "peer":"ipv4:127.0.0.1:51234","tenant":"default","request_id":"abc","traceparent":"00-..."}
//
// `queue_seconds`: the time the call's work waited for its model (Classify: for its batch;
// Generate: until its last image got a cache slot; Score: not measured, 0); `run_seconds` the rest
// (compute, reply building, streaming). `request_id` and `traceparent` are the caller's
// `x-request-id` and W3C `traceparent` metadata, present only when sent (the server echoes them
// in its initial metadata). `tenant`: the call's tenant (server/core/tenants.h), absent for a
// call refused before it had one (a bad token). Thread-safety: Write may be called from any thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace krause::server {

struct CallRecord {
  std::string rpc, protocol, model, version, code, peer, tenant, request_id, traceparent;
  int64_t images = 0;
  double seconds = 0, queue_seconds = 0;
};

// The record as one JSON object on one line (no newline); strings escaped.
std::string FormatCallRecord(const CallRecord& r, absl::Time now);

class RequestLog {
 public:
  // "-": standard error; else the file, appended to.
  static absl::StatusOr<std::unique_ptr<RequestLog>> Open(const std::string& path);
  ~RequestLog();
  void Write(const CallRecord& r);

 private:
  RequestLog(std::FILE* f, bool owned) : f_(f), owned_(owned) {}
  std::FILE* const f_;
  const bool owned_;
  std::mutex mu_;
};

}  // namespace krause::server
