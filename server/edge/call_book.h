// What every call does at its two ends, unary or streaming, whatever its protocol, and who is
// told about it:
//   CallObserver  the metrics' view of calls (server/edge/metrics.h implements it);
//   CallBook      one per call: enters the Gate, keeps what the call did (its model, images,
//                 queue waits and FLOPs, each reported to the observer once, here), and finishes
//                 the call exactly once with an absl::Status, reporting it to the observer and
//                 the request log, then leaving the gate. The transport's answer is the `end`
//                 it passes to Finish (gRPC's: edge/grpc_call.h; HTTP's: edge/http_call.h).
// Nothing here knows a protocol: each transport maps the status in its one place.
// Thread-safety: CallObserver implementations are called from any thread. A CallBook's Enter runs
// on the handler's thread; set_images/Queued/Served may run on model threads; Finish may race
// with itself (a barrier's error after a normal finish) and only the first one counts.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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

// The protocols a call can come in (metrics and request log label values).
inline constexpr char kProtocolKrause[] = "krause.v1";
inline constexpr char kProtocolOipGrpc[] = "oip-grpc";
inline constexpr char kProtocolOipRest[] = "oip-rest";
inline constexpr char kProtocolKrauseConnect[] = "krause.v1-connect";  // krause.v1 over Connect
inline constexpr char kProtocolKrauseHttp[] = "krause.v1-http";        // its generation over HTTP
inline constexpr char kProtocolOpenAi[] = "openai";                    // OpenAI's Images API
inline constexpr char kProtocolHttp[] =
    "http";  // a request the HTTP server refused, no front end's

// Observer of calls (metrics); optional. `model` is "" until the call resolved a served model.
struct CallObserver {
  virtual ~CallObserver() = default;
  // Every call, once, when it finishes. `protocol`: one of the kProtocol* above.
  // `version`: the model's version ("" with the model when the call resolved none).
  virtual void OnCallDone(const std::string& rpc, const std::string& protocol,
                          const std::string& model, const std::string& version,
                          absl::StatusCode code, double seconds) = 0;
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
  // A call of a configured tenant (the token file's names: a bounded set) ended, after its
  // OnCallDone: the images it was served (0 unless it succeeded) and its ErrorInfo reason ("" if
  // none).
  virtual void OnTenantCall(const std::string& tenant, int64_t images, const std::string& reason) {}
};

// A successful call's FLOPs, executed and dense-equivalent (for its reply).
struct CallFlops {
  double executed = 0, dense_equivalent = 0;
};

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

  // Enters the gate with the call's "authorization" (if it sent one), after noting the caller's
  // request ids and peer for the request log.
  absl::Status Enter(std::optional<std::string_view> authorization, std::string request_id,
                     std::string traceparent, std::string peer, bool admin = false) {
    request_id_ = std::move(request_id);
    traceparent_ = std::move(traceparent);
    if (log_ != nullptr) peer_ = std::move(peer);
    const absl::Status st = gate_->Enter(authorization, admin, &share_);
    entered_ = st.ok();
    return st;
  }
  // The call's tenant (tenants.h) and priority, known once it entered the gate.
  const Share& share() const { return share_; }
  // The priority the call asked for (`field`: its wire name), checked against its tenant's
  // max_priority (CheckPriority); the share's priority once it passes.
  absl::Status SetPriority(int64_t priority, absl::string_view field) {
    if (absl::Status st = CheckPriority(share_, priority, field); !st.ok()) return st;
    share_.priority = static_cast<int>(priority);
    return absl::OkStatus();
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
  // A wait of the call's work in its model's queue (Classify: once per call; Generate: once per
  // image, until it got a cache slot): to the observer, and the longest to the request log.
  void Queued(double seconds) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_seconds_ = std::max(queue_seconds_, seconds);
    }
    if (observer_ != nullptr && model_ref_ != nullptr) observer_->OnQueued(rpc_, model_, seconds);
  }
  // A successful call's images, with their FLOPs (the model's per image unless given), to the
  // observer; the FLOPs back for the reply.
  CallFlops Served(int64_t images) {
    const double n = static_cast<double>(images);
    return Served(images, {model_ref_->flops().executed_flops * n,
                           model_ref_->flops().dense_equivalent_flops * n});
  }
  CallFlops Served(int64_t images, CallFlops flops) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      served_ += images;
    }
    if (observer_ != nullptr) {
      observer_->OnFlops(rpc_, model_, flops.executed, flops.dense_equivalent);
      observer_->OnImages(rpc_, model_, images);
    }
    return flops;
  }
  const char* rpc() const { return rpc_; }
  const char* protocol() const { return protocol_; }
  const std::string& model_name() const { return model_; }

  // Finishes the call once: `end` answers it with the status (the model named in its error
  // details). `end` may end the call and free this object: what is needed afterwards is copied
  // first.
  void Finish(const absl::Status& status, const std::function<void(const absl::Status&)>& end) {
    if (finished_.exchange(true)) return;  // a barrier's error after a normal finish
    const absl::Status st = WithModel(status, model_);
    const ErrorDetails d = st.ok() ? ErrorDetails{} : DetailsOf(st);
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (observer_ != nullptr) {
      observer_->OnCallDone(rpc_, protocol_, model_, version_, st.code(), seconds);
      if (!model_.empty()) {
        int64_t images;
        double queued;
        {
          std::lock_guard<std::mutex> lock(mu_);
          images = images_;
          queued = queue_seconds_;
        }
        observer_->OnModelCall(rpc_, model_, version_, st.ok(), seconds, images, queued);
      }
      if (!d.reason.empty()) observer_->OnRefused(rpc_, protocol_, model_, d.reason);
      if (share_.spec != nullptr && gate_ != nullptr && gate_->tenants().configured()) {
        int64_t served;
        {
          std::lock_guard<std::mutex> lock(mu_);
          served = served_;
        }
        observer_->OnTenantCall(share_.name(), st.ok() ? served : 0, d.reason);
      }
    }
    if (log_ != nullptr) {
      CallRecord r;
      r.rpc = rpc_;
      r.protocol = protocol_;
      r.model = model_;
      r.version = version_;
      r.code = CodeName(st.code());
      r.peer = peer_;
      r.request_id = request_id_;
      r.traceparent = traceparent_;
      r.seconds = seconds;
      if (share_.spec != nullptr) r.tenant = share_.name();  // the gate named the tenant
      {
        std::lock_guard<std::mutex> lock(mu_);
        r.images = images_;
        r.queue_seconds = queue_seconds_;
      }
      log_->Write(r);
    }
    const bool entered = entered_;
    const int32_t tenant = share_.tenant;
    Gate* gate = gate_;
    end(st);
    if (entered) gate->Leave(tenant);
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
  bool entered_ = false;
  Share share_;  // the tenant, once the gate named it (entered, or refused at its limit)
  std::atomic<bool> finished_{false};
  std::mutex mu_;  // guards the three below (set from model threads)
  int64_t images_ = 0;
  int64_t served_ = 0;  // images served (Served)
  double queue_seconds_ = 0;
};

}  // namespace krause::server
