// Per model version statistics for the Open Inference Protocol's statistics extension (Triton's
// ModelStatistics), fed by the same events as the Prometheus metrics (server/edge/metrics.h
// forwards them): each finished inference call (Classify, Generate, Score, Inspect, ModelInfer)
// with its time, images and queue wait, and each model execution (a classify batch, a decode step)
// with its batch size and compute time.
//   inference_count  images of successful calls; execution_count  batches and decode steps;
//   success / fail   calls and their summed duration; queue  the calls' longest queue wait;
//   compute_infer    executions and their compute time; batch_stats  the same per batch size.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace krause::server {

struct StatDuration {
  uint64_t count = 0, ns = 0;
  void Add(double seconds) {
    ++count;
    ns += static_cast<uint64_t>(seconds > 0 ? seconds * 1e9 : 0);
  }
};

struct ModelStats {
  std::string name, version;
  uint64_t last_inference_ms = 0;  // since the epoch; 0: none yet
  uint64_t inference_count = 0, execution_count = 0;
  StatDuration success, fail, queue, compute_infer;
  std::map<uint64_t, StatDuration> batches;  // batch size -> compute_infer
};

class StatsBook {
 public:
  void OnInference(const std::string& model, const std::string& version, bool ok, double seconds,
                   int64_t images, double queue_seconds, uint64_t now_ms);
  void OnExecution(const std::string& model, const std::string& version, int64_t batch,
                   double seconds);
  // The statistics of each (name, version) in `served`, zero for one without calls yet.
  std::vector<ModelStats> Of(const std::vector<std::pair<std::string, std::string>>& served) const;

 private:
  ModelStats& At(const std::string& model, const std::string& version);  // under mu_
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, ModelStats> stats_;
};

}  // namespace krause::server
