// krause-loadgen's report: throughput, latency percentiles, the Generate stream's figures, calls
// by status code, the load generator's own CPU time and, with --metrics, the server's view from
// its /metrics before and after the run. Printed as a summary on stdout and, with --json, written
// as JSON (bench/serving_bench.py and scripts/perf-report.sh read it).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/loadgen.h"

namespace krause::loadgen {

struct ReportInput {
  nlohmann::json config;        // the run's settings (the report's "config")
  std::string mode, workload;   // for the summary's first line
  Clock::time_point start;      // when the load began: wall_seconds counts from it
  double measured_seconds = 0;  // the end of the warm-up to the end of the last measured call
  bool resume = false;          // --resume: the resumed streams' figures too
  std::string metrics;          // --metrics host:port (empty: none), scraped again at the end
  std::string metrics_before;   // its /metrics before the run
  std::string json_path;        // --json: the file ('-': stdout; empty: none)
};

// Builds the report from `s` (the run has ended), prints it and writes its JSON. Returns the exit
// code: 3 when a measured call failed, else 0.
int Report(const ReportInput& in, Stats& s);

// Several tenants' runs (--tenants) over the same window: each one's report and summary under
// its name (the JSON's "tenants"), `in.config` as the whole run's. Returns 3 when a measured call
// of any tenant failed, else 0.
struct TenantRun {
  std::string name, workload;
  Stats* stats = nullptr;
};
int ReportTenants(const ReportInput& in, const std::vector<TenantRun>& runs);

// count, mean, p50, p90, p95, p99 and max of `v` (an empty object when `v` is).
nlohmann::json Percentiles(std::vector<double> v);

// The server's view from two scrapes of its /metrics: FLOPs, batch sizes and where a Classify
// call's time went, over the run.
nlohmann::json ServerView(const std::string& before, const std::string& after);

}  // namespace krause::loadgen
