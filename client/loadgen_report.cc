// krause-loadgen's report (loadgen_report.h): the JSON, the summary printed from it, and the exit
// code.
#include "client/loadgen_report.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

#include "client/http_get.h"

namespace krause::loadgen {

using nlohmann::json;

json Percentiles(std::vector<double> v) {
  if (v.empty()) return json::object();
  std::sort(v.begin(), v.end());
  auto q = [&](double p) {
    const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
    return v[i];
  };
  double sum = 0;
  for (double x : v) sum += x;
  return {{"count", v.size()}, {"mean", sum / v.size()}, {"p50", q(0.50)}, {"p90", q(0.90)},
          {"p95", q(0.95)},    {"p99", q(0.99)},         {"max", v.back()}};
}

json ServerView(const std::string& before, const std::string& after) {
  using krause::client::PrometheusSum;
  auto delta = [&](const std::string& name, const std::map<std::string, std::string>& l = {}) {
    return PrometheusSum(after, name, l) - PrometheusSum(before, name, l);
  };
  json j;
  const double ex = delta("krause_flops_executed_total"),
               de = delta("krause_flops_dense_equivalent_total");
  j["flops_executed"] = ex;
  j["flops_dense_equivalent"] = de;
  j["flop_saving"] = de > 0 ? 1 - ex / de : 0.0;
  const double cb = delta("krause_classify_batch_images_count");
  j["classify_batches"] = cb;
  j["classify_mean_batch_images"] = cb > 0 ? delta("krause_classify_batch_images_sum") / cb : 0.0;
  const double ds = delta("krause_decode_batch_sequences_count");
  j["decode_steps"] = ds;
  j["decode_mean_batch_sequences"] = ds > 0 ? delta("krause_decode_batch_sequences_sum") / ds : 0.0;
  j["generated_pixels"] = delta("krause_generated_pixels_total");
  // Where a Classify call's time went inside the server (means over the run): the whole call,
  // waiting for its batch, and the batch's forward.
  auto mean = [&](const std::string& name, const std::map<std::string, std::string>& l) {
    const double n = delta(name + "_count", l);
    return n > 0 ? delta(name + "_sum", l) / n : 0.0;
  };
  j["classify_call_mean_seconds"] = mean("krause_request_duration_seconds", {{"rpc", "Classify"}});
  j["classify_queue_mean_seconds"] = mean("krause_queue_duration_seconds", {{"rpc", "Classify"}});
  j["classify_batch_compute_mean_seconds"] =
      mean("krause_compute_duration_seconds", {{"work", "classify_batch"}});
  return j;
}

namespace {

json BuildReport(const ReportInput& in, Stats& s) {
  json report;
  report["config"] = in.config;
  int64_t calls = 0;
  for (auto& [rpc, codes] : s.codes) {
    for (auto& [code, n] : codes) calls += n;
    report["errors_by_code"][rpc] = codes;
    report["latency_seconds"][rpc] = Percentiles(s.latency[rpc]);
  }
  const double measured_seconds = in.measured_seconds;
  report["measured_seconds"] = measured_seconds;
  // The load generator's own CPU time over the whole run (it shares the cores with the server).
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                     1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  report["cpu_seconds"] = cpu;
  report["wall_seconds"] = Seconds(Clock::now() - in.start);
  report["calls"] = calls;
  report["calls_per_second"] = calls / measured_seconds;
  report["images_per_second"] = s.images / measured_seconds;
  report["generate_first_chunk_seconds"] = Percentiles(s.first_chunk);
  report["generate_first_pixel_seconds"] = Percentiles(s.first_pixel);
  report["generate_chunk_gap_seconds"] = Percentiles(s.chunk_gap);
  if (!s.error_samples.empty()) report["error_samples"] = s.error_samples;
  if (in.resume) {
    report["resumed_streams"] = s.resumed_streams;
    report["resume_calls"] = s.resume_calls;
    report["rows_recomputed"] = s.rows_recomputed;
  }
  if (!in.metrics.empty()) {
    auto after = krause::client::HttpGet(in.metrics, "/metrics");
    if (after.ok()) report["server"] = ServerView(in.metrics_before, *after);
  }
  return report;
}

// `report` is not const: as ever, a run with no measured call reads "latency_seconds" into it (a
// null, which --json then writes).
void PrintSummary(const ReportInput& in, json& report, const Stats& s) {
  const double measured_seconds = in.measured_seconds;
  const int64_t calls = report["calls"].get<int64_t>();
  std::printf("%s loop, %s, %.1f s measured: %lld calls, %.2f calls/s, %.2f images/s\n",
              in.mode.c_str(), in.workload.c_str(), measured_seconds, static_cast<long long>(calls),
              calls / measured_seconds, s.images / measured_seconds);
  std::printf("  load generator CPU: %.2f s over %.2f s of wall time\n",
              report["cpu_seconds"].get<double>(), report["wall_seconds"].get<double>());
  for (auto& [rpc, p] : report["latency_seconds"].items()) {
    if (p.empty()) continue;
    std::printf("  %-9s latency ms: p50 %.1f  p90 %.1f  p95 %.1f  p99 %.1f  max %.1f\n",
                rpc.c_str(), 1e3 * p["p50"].get<double>(), 1e3 * p["p90"].get<double>(),
                1e3 * p["p95"].get<double>(), 1e3 * p["p99"].get<double>(),
                1e3 * p["max"].get<double>());
  }
  if (!s.first_chunk.empty()) {
    const json& f = report["generate_first_chunk_seconds"];
    const json& g = report["generate_chunk_gap_seconds"];
    const json& fp = report["generate_first_pixel_seconds"];
    std::printf(
        "  Generate  first chunk ms: p50 %.1f p99 %.1f; first pixels ms: p50 %.1f p99 %.1f; "
        "gaps of running streams ms: p50 %.1f p99 %.1f\n",
        1e3 * f["p50"].get<double>(), 1e3 * f["p99"].get<double>(),
        fp.empty() ? 0.0 : 1e3 * fp["p50"].get<double>(),
        fp.empty() ? 0.0 : 1e3 * fp["p99"].get<double>(),
        g.empty() ? 0.0 : 1e3 * g["p50"].get<double>(),
        g.empty() ? 0.0 : 1e3 * g["p99"].get<double>());
  }
  for (auto& [rpc, codes] : s.codes)
    for (auto& [code, n] : codes)
      std::printf("  %s %s: %lld\n", rpc.c_str(), code.c_str(), static_cast<long long>(n));
  for (const std::string& e : s.error_samples) std::printf("  error: %s\n", e.c_str());
  if (in.resume)
    std::printf("  Generate  resumed streams: %lld (on %lld calls), rows recomputed: %lld\n",
                static_cast<long long>(s.resumed_streams), static_cast<long long>(s.resume_calls),
                static_cast<long long>(s.rows_recomputed));
  if (report.contains("server")) {
    const json& v = report["server"];
    std::printf(
        "  server: FLOP saving %.1f%%, mean classify batch %.2f images, mean decode batch %.2f "
        "sequences\n",
        100 * v["flop_saving"].get<double>(), v["classify_mean_batch_images"].get<double>(),
        v["decode_mean_batch_sequences"].get<double>());
  }
}

void WriteJson(const ReportInput& in, const json& report) {
  if (in.json_path == "-") {
    std::cout << report.dump(2) << "\n";
  } else if (!in.json_path.empty()) {
    std::ofstream(in.json_path) << report.dump(2) << "\n";
  }
}

int64_t Failures(const Stats& s) {
  int64_t failures = 0;
  for (auto& [rpc, codes] : s.codes)
    for (auto& [code, n] : codes)
      if (code != "OK") failures += n;
  return failures;
}

}  // namespace

int Report(const ReportInput& in, Stats& s) {
  json report = BuildReport(in, s);
  PrintSummary(in, report, s);
  WriteJson(in, report);
  return Failures(s) > 0 ? 3 : 0;
}

int ReportTenants(const ReportInput& in, const std::vector<TenantRun>& runs) {
  json all;
  all["config"] = in.config;
  int64_t failures = 0;
  ReportInput each = in;
  each.metrics.clear();  // the server's view is the whole run's, once below
  for (const TenantRun& r : runs) {
    std::printf("tenant %s:\n", r.name.c_str());
    each.workload = r.workload;
    json report = BuildReport(each, *r.stats);
    PrintSummary(each, report, *r.stats);
    report.erase("config");
    report["workload"] = r.workload;
    all["tenants"][r.name] = report;
    failures += Failures(*r.stats);
  }
  if (!in.metrics.empty()) {
    auto after = krause::client::HttpGet(in.metrics, "/metrics");
    if (after.ok()) all["server"] = ServerView(in.metrics_before, *after);
  }
  WriteJson(in, all);
  return failures > 0 ? 3 : 0;
}

}  // namespace krause::loadgen
