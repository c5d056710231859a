// What every call does at its two ends, unary or streaming, and who is told about it.
//   SteadyDeadline the call's deadline on the clock the workers use;
//   CallObserver  the metrics' view of calls (server/edge/metrics.h implements it);
//   CallBook      one per call: enters the Gate (echoing the caller's x-request-id and
//                 traceparent in the initial metadata), and finishes the call exactly once,
//                 reporting it to the observer and the request log, then leaving the gate.
// Thread-safety: CallObserver implementations are called from any thread. A CallBook's Enter runs
// on the handler's thread; set_images/NoteQueued may run on model threads; Finish may race with
// itself (a barrier's error after a normal finish) and only the first one counts.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "server/core/served_model.h"
#include "server/edge/gate.h"
#include "server/edge/request_log.h"
#include "server/edge/status.h"

namespace krause::server {

// The call's deadline on the steady clock (max when it has none).
inline std::chrono::steady_clock::time_point SteadyDeadline(
    const grpc::CallbackServerContext* ctx) {
  using Clock = std::chrono::steady_clock;
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  const auto left = d - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

// The protocols a call can come in (metrics and request log label values).
inline constexpr char kProtocolKrause[] = "krause.v1";
inline constexpr char kProtocolOipGrpc[] = "oip-grpc";
inline constexpr char kProtocolOipRest[] = "oip-rest";
inline constexpr char kProtocolKrauseConnect[] = "krause.v1-connect";  // krause.v1 over HTTP

// Observer of calls (metrics); optional. `model` is "" until the call resolved a served model.
struct CallObserver {
  virtual ~CallObserver() = default;
  // Every call, once, when it finishes. `protocol`: kProtocolKrause, kProtocolOipGrpc,
  // kProtocolOipRest or kProtocolKrauseConnect.
  // `version`: the model's version ("" with the model when the call resolved none).
  virtual void OnCallDone(const std::string& rpc, const std::string& protocol,
                          const std::string& model, const std::string& version,
                          grpc::StatusCode code, double seconds) = 0;
  // Time a call's work waited in its model's queue before it ran (Classify: once per call;
  // Generate: once per image, until it got a cache slot).
  virtual void OnQueued(const std::string& rpc, const std::string& model, double seconds) {}
  // FLOPs of a successful call, executed and dense-equivalent.
  virtual void OnFlops(const std::string& rpc, const std::string& model, double executed,
                       double dense) {}
  // Images a successful call classified, generated or scored.
  virtual void OnImages(const std::string& rpc, const std::string& model, int64_t images) {}
  // A Generate message was sent: `first`: seconds since the call arrived; else since the
  // previous message.
  virtual void OnStreamChunk(const std::string& model, bool first, double seconds) {}
  // Every call that resolved a model, once, when it finishes, with what its book knows: the
  // images it asked for and its longest queue wait (the statistics extension's source).
  virtual void OnModelCall(const std::string& rpc, const std::string& model,
                           const std::string& version, bool ok, double seconds, int64_t images,
                           double queue_seconds) {}
  // A call that failed with a google.rpc.ErrorInfo reason (server/edge/status.h: QUEUE_FULL,
  // DRAINING, ...), after its OnCallDone.
  virtual void OnRefused(const std::string& rpc, const std::string& protocol,
                         const std::string& model, const std::string& reason) {}
};

// A successful call's images: its FLOPs (executed, dense-equivalent) for the reply, reported to
// the observer (may be null) with the images.
struct CallFlops {
  double executed = 0, dense_equivalent = 0;
};
inline CallFlops ReportImages(CallObserver* observer, const char* rpc, const ServedModel& m,
                              int64_t images) {
  const double n = static_cast<double>(images);
  const CallFlops f{m.flops().executed_flops * n, m.flops().dense_equivalent_flops * n};
  if (observer != nullptr) {
    observer->OnFlops(rpc, m.name(), f.executed, f.dense_equivalent);
    observer->OnImages(rpc, m.name(), images);
  }
  return f;
}

class CallBook {
 public:
  using Clock = std::chrono::steady_clock;

  // observer and log may be null; all must outlive the call.
  CallBook(Gate* gate, CallObserver* observer, RequestLog* log, const char* rpc,
           const char* protocol = kProtocolKrause)
      : gate_(gate),
        observer_(observer),
        log_(log),
        rpc_(rpc),
        protocol_(protocol),
        start_(Clock::now()) {}

  // A call that did not come over gRPC (REST): the same, from plain values.
  absl::Status Enter(std::optional<std::string_view> authorization, std::string request_id,
                     std::string traceparent, std::string peer, bool admin = false) {
    request_id_ = std::move(request_id);
    traceparent_ = std::move(traceparent);
    if (log_ != nullptr) peer_ = std::move(peer);
    const absl::Status st = gate_->Enter(authorization, admin);
    entered_ = st.ok();
    return st;
  }

  absl::Status Enter(grpc::CallbackServerContext* ctx, bool admin = false) {
    // The caller's request ids go back in the initial metadata (nothing is sent yet) and into
    // the request log.
    const auto& md = ctx->client_metadata();
    for (const char* key : {"x-request-id", "traceparent"}) {
      const auto it = md.find(key);
      if (it == md.end()) continue;
      std::string value(it->second.data(), std::min<size_t>(it->second.size(), 256));
      ctx->AddInitialMetadata(key, value);
      (key[0] == 'x' ? request_id_ : traceparent_) = std::move(value);
    }
    if (log_ != nullptr) peer_ = ctx->peer();
    ctx_ = ctx;
    std::optional<std::string_view> authorization;
    if (const auto it = md.find("authorization"); it != md.end())
      authorization = std::string_view(it->second.data(), it->second.size());
    const absl::Status st = gate_->Enter(authorization, admin);
    entered_ = st.ok();
    return st;
  }
  // A call the HTTP server refused before it reached a handler (no gate, no token): only its
  // client, for the request log.
  void NoteRefused(std::string peer) {
    if (log_ != nullptr) peer_ = std::move(peer);
  }
  // The served model (and version) the call resolved. The book holds the reference until the
  // call is freed: a version replaced or unloaded meanwhile keeps serving this call.
  void set_model(std::shared_ptr<const ServedModel> m) {
    model_ = m->name();
    version_ = std::to_string(m->info().version);
    model_ref_ = std::move(m);
  }
  Clock::time_point start() const { return start_; }
  // For the request log: the call's images, and the time its work waited (the longest wait).
  void set_images(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    images_ = n;
  }
  void NoteQueued(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_seconds_ = std::max(queue_seconds_, seconds);
  }

  // reactor->Finish may end the call and free the reactor (and this object with it): what is
  // needed afterwards is copied first. Any object with Finish(grpc::Status) will do (REST's
  // replies map the code to an HTTP status).
  template <typename Reactor>
  void Finish(Reactor* reactor, const absl::Status& st) {
    if (finished_.exchange(true)) return;  // a barrier's error after a normal finish
    const grpc::Status g = ToGrpcStatus(WithModel(st, model_));
    // A refusal's RetryInfo also as gRPC's own pushback, which the clients' retry policy
    // honours: retry at once on another replica when draining, after the delay when full.
    const ErrorDetails d = st.ok() ? ErrorDetails{} : DetailsOf(st);
    if (ctx_ != nullptr && d.retry_delay)
      ctx_->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(d.retry_delay->count()));
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (observer_ != nullptr) {
      observer_->OnCallDone(rpc_, protocol_, model_, version_, g.error_code(), seconds);
      if (!model_.empty()) {
        int64_t images;
        double queued;
        {
          std::lock_guard<std::mutex> lock(mu_);
          images = images_;
          queued = queue_seconds_;
        }
        observer_->OnModelCall(rpc_, model_, version_, g.ok(), seconds, images, queued);
      }
      if (!d.reason.empty()) observer_->OnRefused(rpc_, protocol_, model_, d.reason);
    }
    if (log_ != nullptr) {
      CallRecord r;
      r.rpc = rpc_;
      r.protocol = protocol_;
      r.model = model_;
      r.version = version_;
      r.code = GrpcCodeName(g.error_code());
      r.peer = peer_;
      r.request_id = request_id_;
      r.traceparent = traceparent_;
      r.seconds = seconds;
      {
        std::lock_guard<std::mutex> lock(mu_);
        r.images = images_;
        r.queue_seconds = queue_seconds_;
      }
      log_->Write(r);
    }
    const bool entered = entered_;
    Gate* gate = gate_;
    reactor->Finish(g);
    if (entered) gate->Leave();
  }

 private:
  Gate* const gate_;
  CallObserver* const observer_;
  RequestLog* const log_;
  const char* const rpc_;
  const char* const protocol_;
  const Clock::time_point start_;
  std::string model_, version_;  // "" until the call resolved a model
  std::shared_ptr<const ServedModel> model_ref_;
  std::string peer_, request_id_, traceparent_;
  grpc::CallbackServerContext* ctx_ = nullptr;  // gRPC calls: set by Enter, valid until Finish
  bool entered_ = false;
  std::atomic<bool> finished_{false};
  std::mutex mu_;  // guards the two below (set from model threads)
  int64_t images_ = 0;
  double queue_seconds_ = 0;
};

// A unary call on gRPC's default reactor, with its book.
class UnaryCall {
 public:
  UnaryCall(Gate* gate, CallObserver* observer, RequestLog* log, grpc::CallbackServerContext* ctx,
            const char* rpc, const char* protocol = kProtocolKrause)
      : book_(gate, observer, log, rpc, protocol), reactor_(ctx->DefaultReactor()) {}

  // Enters the gate; on refusal finishes the call and returns false.
  bool Enter(grpc::CallbackServerContext* ctx, bool admin = false) {
    const absl::Status st = book_.Enter(ctx, admin);
    if (!st.ok()) Finish(st);
    return st.ok();
  }
  CallBook* book() { return &book_; }
  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  void Finish(const absl::Status& st) { book_.Finish(reactor_, st); }

 private:
  CallBook book_;
  grpc::ServerUnaryReactor* reactor_;
};

}  // namespace krause::server
