#include "server/edge/metrics.h"

#include <ATen/core/Tensor.h>
#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/edge/http_endpoint.h"
#include "server/edge/status.h"

#ifndef KRAUSE_VERSION
#define KRAUSE_VERSION "unknown"
#endif

namespace krause::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// 1 ms .. ~9 min, doubling.
Histogram::BucketBoundaries SecondsBuckets() {
  Histogram::BucketBoundaries b;
  for (double v = 0.001; v < 600; v *= 2) b.push_back(v);
  return b;
}

// 1 .. 4096, doubling.
Histogram::BucketBoundaries SizeBuckets() {
  Histogram::BucketBoundaries b;
  for (double v = 1; v <= 4096; v *= 2) b.push_back(v);
  return b;
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

// A served model's gauge, labelled with its name and version (two versions of a model may be
// served at once).
void AddGauge(prometheus::MetricFamily* f, const std::string& model, int64_t version, double v) {
  prometheus::ClientMetric m;
  m.label.push_back({"model", model});
  m.label.push_back({"version", std::to_string(version)});
  m.gauge.value = v;
  f->metric.push_back(std::move(m));
}

}  // namespace

// Gauges read from the registry at scrape time.
class Metrics::Gauges : public prometheus::Collectable {
 public:
  void Set(const Registry* r) {
    std::lock_guard<std::mutex> l(mu_);
    registry_ = r;
  }
  void SetGate(const Gate* g) {
    std::lock_guard<std::mutex> l(mu_);
    gate_ = g;
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    auto queued = Family("krause_queued_images",
                         "Images waiting: classify queue, or generator sequences waiting for a "
                         "cache slot.",
                         MetricType::Gauge);
    auto active = Family("krause_active_sequences", "Generator sequences holding a cache slot.",
                         MetricType::Gauge);
    auto slots =
        Family("krause_kv_cache_slots", "Generator cache slots in all.", MetricType::Gauge);
    auto used =
        Family("krause_kv_cache_slots_in_use", "Generator cache slots in use.", MetricType::Gauge);
    auto bytes = Family("krause_kv_cache_bytes", "Bytes of the generator's KV cache in all.",
                        MetricType::Gauge);
    auto bytes_used =
        Family("krause_kv_cache_bytes_in_use",
               "Bytes of the generator's KV cache held by active sequences.", MetricType::Gauge);
    auto calls = Family("krause_calls_in_flight",
                        "KrauseService calls in flight: past the gate (token, drain), not yet "
                        "finished. 0 when the server is idle.",
                        MetricType::Gauge);
    auto checks = Family("krause_kernel_check",
                         "The load-time kernel check of each implementation tried for a served "
                         "model (1 per model, version, implementation, device and result: "
                         "passed, mismatch, non_finite, error, unchecked); the model serves on "
                         "the one that passed.",
                         MetricType::Gauge);
    auto precision = Family("krause_model_precision",
                            "The arithmetic a served model computes in (1 per model, version, "
                            "precision: fp32 or bf16, and what computes its linear layers: the "
                            "CPU kernels' variant, oneDNN's kernel, or \"\" for LibTorch/CUDA).",
                            MetricType::Gauge);
    auto tenant_calls =
        Family("krause_tenant_calls_in_flight",
               "Calls in flight by tenant (configured tenants: --auth_tokens).", MetricType::Gauge);
    auto tenant_queued = Family("krause_tenant_queued_calls",
                                "Calls waiting by tenant, over every model: in a classify queue, "
                                "or with an image waiting for a generator's cache slot "
                                "(configured tenants).",
                                MetricType::Gauge);
    std::lock_guard<std::mutex> l(mu_);
    // The configured tenants' names, by index (none without a token file).
    std::vector<std::string> tenants;
    if (gate_ != nullptr && gate_->tenants().configured())
      for (const auto& t : gate_->tenants().tenants()) tenants.push_back(t->name);
    std::vector<int64_t> queued_by_tenant(tenants.size(), 0);
    if (gate_ != nullptr) {
      prometheus::ClientMetric m;
      m.gauge.value = static_cast<double>(gate_->in_flight());
      calls.metric.push_back(std::move(m));
      for (size_t t = 0; t < tenants.size(); ++t) {
        prometheus::ClientMetric c;
        c.label = {{"tenant", tenants[t]}};
        c.gauge.value = static_cast<double>(gate_->in_flight(static_cast<int32_t>(t)));
        tenant_calls.metric.push_back(std::move(c));
      }
    }
    if (registry_ != nullptr) {
      const auto add = [&](const std::string& name, int64_t version, const ModelGauges& g) {
        AddGauge(&queued, name, version, static_cast<double>(g.queued_images));
        for (size_t t = 0; t < g.tenant_queued_calls.size() && t < tenants.size(); ++t)
          queued_by_tenant[t] += g.tenant_queued_calls[t];
        if (!g.cache) return;
        const ModelGauges::Cache& c = *g.cache;
        const double per = static_cast<double>(c.bytes_per_slot);
        AddGauge(&active, name, version, static_cast<double>(c.active_sequences));
        AddGauge(&slots, name, version, static_cast<double>(c.slots));
        AddGauge(&used, name, version, static_cast<double>(c.slots_in_use));
        AddGauge(&bytes, name, version, per * static_cast<double>(c.slots));
        AddGauge(&bytes_used, name, version, per * static_cast<double>(c.slots_in_use));
      };
      // Served versions, then replaced or unloaded ones still finishing their calls, then freed
      // ones (0: their memory is returned).
      std::set<std::pair<std::string, int64_t>> seen;
      for (const auto& list : {registry_->models(), registry_->retiring()})
        for (const auto& m : list)
          if (seen.emplace(m->name(), m->info().version).second) {
            add(m->name(), m->info().version, m->Gauges());
            prometheus::ClientMetric p;
            p.label = {{"model", m->name()},
                       {"version", std::to_string(m->info().version)},
                       {"precision", m->info().precision},
                       {"linear_kernels", m->info().linear_kernels}};
            p.gauge.value = 1;
            precision.metric.push_back(std::move(p));
            for (const KernelCheckRecord& r : m->info().kernel_checks) {
              prometheus::ClientMetric c;
              c.label = {{"model", m->name()},
                         {"version", std::to_string(m->info().version)},
                         {"implementation", r.implementation},
                         {"device", r.device},
                         {"result", r.result}};
              c.gauge.value = 1;
              checks.metric.push_back(std::move(c));
            }
          }
      for (const Registry::Freed& f : registry_->freed()) {
        if (!seen.emplace(f.name, f.version).second) continue;
        ModelGauges zero;
        if (f.kind == ModelKind::kGenerator) zero.cache.emplace();
        add(f.name, f.version, zero);
      }
    }
    for (size_t t = 0; t < tenants.size(); ++t) {
      prometheus::ClientMetric c;
      c.label = {{"tenant", tenants[t]}};
      c.gauge.value = static_cast<double>(queued_by_tenant[t]);
      tenant_queued.metric.push_back(std::move(c));
    }
    return {calls,      queued, active,    slots,        used,         bytes,
            bytes_used, checks, precision, tenant_calls, tenant_queued};
  }

 private:
  mutable std::mutex mu_;
  const Registry* registry_ = nullptr;
  const Gate* gate_ = nullptr;
};

Metrics::Metrics()
    : prom_(std::make_shared<prometheus::Registry>()),
      gauges_(std::make_shared<Gauges>()),
      requests_(BuildCounter()
                    .Name("krause_requests_total")
                    .Help("Finished calls by rpc, protocol, model, version and gRPC status code.")
                    .Register(*prom_)),
      refusals_(BuildCounter()
                    .Name("krause_refusals_total")
                    .Help("Failed calls by the google.rpc.ErrorInfo reason they carried "
                          "(QUEUE_FULL, DRAINING, MODEL_LOADING, MODEL_UNLOADED), by rpc, "
                          "protocol and model; each is also in krause_requests_total.")
                    .Register(*prom_)),
      latency_(BuildHistogram()
                   .Name("krause_request_duration_seconds")
                   .Help("Call latency from arrival to the final status, by rpc, protocol, model "
                         "and version.")
                   .Register(*prom_)),
      queue_(BuildHistogram()
                 .Name("krause_queue_duration_seconds")
                 .Help("Time waiting in the model's queue: Classify per call (until its batch "
                       "runs), Generate per image (until it gets a KV cache slot).")
                 .Register(*prom_)),
      compute_(BuildHistogram()
                   .Name("krause_compute_duration_seconds")
                   .Help("Model compute per batch: a classify batch's forward, or one decode step.")
                   .Register(*prom_)),
      first_chunk_(BuildHistogram()
                       .Name("krause_generate_first_chunk_seconds")
                       .Help("Generate: time from the call's arrival to its first message.")
                       .Register(*prom_)),
      chunk_gap_(BuildHistogram()
                     .Name("krause_generate_chunk_gap_seconds")
                     .Help("Generate: time between consecutive messages of a stream.")
                     .Register(*prom_)),
      classify_batch_(BuildHistogram()
                          .Name("krause_classify_batch_images")
                          .Help("Images per classify batch (dynamic batching).")
                          .Register(*prom_)),
      decode_batch_(BuildHistogram()
                        .Name("krause_decode_batch_sequences")
                        .Help("Sequences per decode step (continuous batching).")
                        .Register(*prom_)),
      images_(BuildCounter()
                  .Name("krause_images_total")
                  .Help("Images classified, generated or scored by successful calls.")
                  .Register(*prom_)),
      pixels_(BuildCounter()
                  .Name("krause_generated_pixels_total")
                  .Help("Subpixels sampled by the decode engines.")
                  .Register(*prom_)),
      flops_executed_(BuildCounter()
                          .Name("krause_flops_executed_total")
                          .Help("Floating-point operations executed by successful calls.")
                          .Register(*prom_)),
      flops_dense_(BuildCounter()
                       .Name("krause_flops_dense_equivalent_total")
                       .Help("FLOPs the same calls would cost with dense attention; "
                             "1 - executed/dense is the saving.")
                       .Register(*prom_)),
      tenant_calls_(BuildCounter()
                        .Name("krause_tenant_calls_total")
                        .Help("Calls that passed the token check, by configured tenant "
                              "(--auth_tokens).")
                        .Register(*prom_)),
      tenant_images_(BuildCounter()
                         .Name("krause_tenant_images_total")
                         .Help("Images served (classified, generated, scored), by configured "
                               "tenant.")
                         .Register(*prom_)),
      tenant_refusals_(BuildCounter()
                           .Name("krause_tenant_refusals_total")
                           .Help("Calls refused with a google.rpc.ErrorInfo reason "
                                 "(TENANT_LIMIT, QUEUE_FULL, ...), by configured tenant and "
                                 "reason.")
                           .Register(*prom_)) {
  BuildGauge()
      .Name("krause_build_info")
      .Help("Build information (value 1).")
      .Register(*prom_)
      .Add({{"version", KRAUSE_VERSION}, {"torch", KRAUSE_TORCH_VERSION}})
      .Set(1);
}

Metrics::~Metrics() { http_.reset(); }

absl::StatusOr<int> Metrics::Listen(const std::string& address, std::set<std::string> tokens) {
  HttpEndpointOptions o;
  o.address = address;
  o.body = [this] { return Scrape(); };
  o.tokens = std::move(tokens);
  auto http = HttpEndpoint::Start(std::move(o));
  if (!http.ok())
    return absl::Status(http.status().code(), absl::StrCat("metrics: ", http.status().message()));
  http_ = std::move(*http);
  return http_->port();
}

void Metrics::SetRegistry(const Registry* registry) { gauges_->Set(registry); }
void Metrics::SetGate(const Gate* gate) { gauges_->SetGate(gate); }

std::string Metrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = prom_->Collect();
  for (auto& f : gauges_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

WorkerHooks Metrics::Hooks() {
  WorkerHooks h;
  h.on_classify_batch = [this](const std::string& model, const BatchEvent& e) {
    classify_batch_.Add({{"model", model}}, SizeBuckets()).Observe(static_cast<double>(e.images));
    compute_.Add({{"model", model}, {"work", "classify_batch"}}, SecondsBuckets())
        .Observe(e.compute_seconds);
    stats_.OnExecution(model, std::to_string(e.version), e.images, e.compute_seconds);
  };
  h.on_decode_step = [this](const std::string& model, const DecodeEvent& e) {
    if (e.stats.batch > 0) {
      decode_batch_.Add({{"model", model}}, SizeBuckets())
          .Observe(static_cast<double>(e.stats.sequences));
      compute_.Add({{"model", model}, {"work", "decode_step"}}, SecondsBuckets())
          .Observe(e.seconds);
      pixels_.Add({{"model", model}}).Increment(static_cast<double>(e.stats.sequences));
      stats_.OnExecution(model, std::to_string(e.version), e.stats.sequences, e.seconds);
    }
  };
  return h;
}

void Metrics::OnCallDone(const std::string& rpc, const std::string& protocol,
                         const std::string& model, const std::string& version,
                         absl::StatusCode code, double seconds) {
  requests_
      .Add({{"rpc", rpc},
            {"protocol", protocol},
            {"model", model},
            {"version", version},
            {"code", CodeName(code)}})
      .Increment();
  latency_
      .Add({{"rpc", rpc}, {"protocol", protocol}, {"model", model}, {"version", version}},
           SecondsBuckets())
      .Observe(seconds);
}

void Metrics::OnModelCall(const std::string& rpc, const std::string& model,
                          const std::string& version, bool ok, double seconds, int64_t images,
                          double queue_seconds) {
  // Inferences only (not metadata or model control): what the statistics extension counts.
  if (rpc != "Classify" && rpc != "Generate" && rpc != "Score" && rpc != "Inspect" &&
      rpc != "ModelInfer")
    return;
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  stats_.OnInference(model, version, ok, seconds, images, queue_seconds,
                     static_cast<uint64_t>(now.count()));
}

void Metrics::OnRefused(const std::string& rpc, const std::string& protocol,
                        const std::string& model, const std::string& reason) {
  refusals_.Add({{"rpc", rpc}, {"protocol", protocol}, {"model", model}, {"reason", reason}})
      .Increment();
}

void Metrics::OnTenantCall(const std::string& tenant, int64_t images, const std::string& reason) {
  tenant_calls_.Add({{"tenant", tenant}}).Increment();
  if (images > 0) tenant_images_.Add({{"tenant", tenant}}).Increment(static_cast<double>(images));
  if (!reason.empty()) tenant_refusals_.Add({{"tenant", tenant}, {"reason", reason}}).Increment();
}

void Metrics::OnQueued(const std::string& rpc, const std::string& model, double seconds) {
  queue_.Add({{"rpc", rpc}, {"model", model}}, SecondsBuckets()).Observe(seconds);
}

void Metrics::OnFlops(const std::string& rpc, const std::string& model, double executed,
                      double dense) {
  flops_executed_.Add({{"rpc", rpc}, {"model", model}}).Increment(executed);
  flops_dense_.Add({{"rpc", rpc}, {"model", model}}).Increment(dense);
}

void Metrics::OnImages(const std::string& rpc, const std::string& model, int64_t images) {
  images_.Add({{"rpc", rpc}, {"model", model}}).Increment(static_cast<double>(images));
}

void Metrics::OnStreamChunk(const std::string& model, bool first, double seconds) {
  // A stream's first chunk also creates the model's gap series, so a scrape shows a gap count of
  // 0 (not a missing series) when every stream so far came in one chunk.
  auto& gap = chunk_gap_.Add({{"model", model}}, SecondsBuckets());
  if (first)
    first_chunk_.Add({{"model", model}}, SecondsBuckets()).Observe(seconds);
  else
    gap.Observe(seconds);
}

}  // namespace krause::server
