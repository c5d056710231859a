// Prometheus metrics of krause-server (prometheus-cpp's metric types and text format), served on
// `/metrics` on their own port (server/edge/http_endpoint.h, one event-loop thread). Names follow
// Prometheus conventions (base units, _total, _seconds, _bytes); labels are model (a served model's
// name, or "" when the request named none that exists), version (the served version, "" with no
// model), rpc, code and (calls) protocol (krause.v1, krause.v1-connect, krause.v1-http, oip-grpc,
// oip-rest, http), so cardinality is bounded by the models served. Gauges of queues, sequences and
// caches are read from the registry at scrape time. Thread-safety: every method may be called from
// any thread.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "server/core/registry.h"
#include "server/edge/call_book.h"
#include "server/edge/gate.h"
#include "server/edge/model_stats.h"

namespace krause::server {

class Metrics : public CallObserver {
 public:
  Metrics();
  ~Metrics() override;

  // Serves /metrics on host:port (port 0: any free port); with `tokens`, a scrape needs
  // "Authorization: Bearer <token>". Returns the port.
  absl::StatusOr<int> Listen(const std::string& address, std::set<std::string> tokens = {});
  // The registry whose queues and caches the gauges report (null: none yet).
  void SetRegistry(const Registry* registry);
  // The gate whose calls in flight krause_calls_in_flight reports (null: none).
  void SetGate(const Gate* gate);
  // Worker hooks feeding the batch, step and generation metrics.
  WorkerHooks Hooks();
  // The text exposition (what /metrics serves), for tests and debugging.
  std::string Scrape() const;

  void OnCallDone(const std::string& rpc, const std::string& protocol, const std::string& model,
                  const std::string& version, absl::StatusCode code, double seconds) override;
  void OnQueued(const std::string& rpc, const std::string& model, double seconds) override;
  void OnFlops(const std::string& rpc, const std::string& model, double executed,
               double dense) override;
  void OnImages(const std::string& rpc, const std::string& model, int64_t images) override;
  void OnStreamChunk(const std::string& model, bool first, double seconds) override;
  void OnRefused(const std::string& rpc, const std::string& protocol, const std::string& model,
                 const std::string& reason) override;
  void OnModelCall(const std::string& rpc, const std::string& model, const std::string& version,
                   bool ok, double seconds, int64_t images, double queue_seconds) override;
  void OnTenantCall(const std::string& tenant, int64_t images, const std::string& reason) override;
  // The statistics extension's per-version figures, fed by the same events.
  const StatsBook& stats() const { return stats_; }

 private:
  class Gauges;
  std::shared_ptr<prometheus::Registry> prom_;
  std::shared_ptr<Gauges> gauges_;
  std::unique_ptr<class HttpEndpoint> http_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& refusals_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Histogram>& queue_;
  prometheus::Family<prometheus::Histogram>& compute_;
  prometheus::Family<prometheus::Histogram>& first_chunk_;
  prometheus::Family<prometheus::Histogram>& chunk_gap_;
  prometheus::Family<prometheus::Histogram>& classify_batch_;
  prometheus::Family<prometheus::Histogram>& decode_batch_;
  prometheus::Family<prometheus::Counter>& images_;
  prometheus::Family<prometheus::Counter>& pixels_;
  prometheus::Family<prometheus::Counter>& flops_executed_;
  prometheus::Family<prometheus::Counter>& flops_dense_;
  prometheus::Family<prometheus::Counter>& tenant_calls_;
  prometheus::Family<prometheus::Counter>& tenant_images_;
  prometheus::Family<prometheus::Counter>& tenant_refusals_;
  StatsBook stats_;
};

}  // namespace krause::server
