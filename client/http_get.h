// A minimal HTTP/1.0 GET over a plain TCP socket, for scraping Prometheus /metrics (the load
// generator, the tests). Thread-safety: pure function.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace krause::client {

// GET http://host:port/path; the body on status 200, else an error naming the status line.
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    double timeout_seconds = 5);

// One sample of a Prometheus text exposition: the value of `name` whose labels are exactly
// `labels`; NotFound when there is none.
absl::StatusOr<double> PrometheusSample(const std::string& text, const std::string& name,
                                        const std::map<std::string, std::string>& labels);
// The sum of every sample of `name` whose labels include `labels` (0 when none).
double PrometheusSum(const std::string& text, const std::string& name,
                     const std::map<std::string, std::string>& labels = {});

}  // namespace krause::client
