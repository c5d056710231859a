#include "server/edge/model_stats.h"

namespace krause::server {

ModelStats& StatsBook::At(const std::string& model, const std::string& version) {
  ModelStats& s = stats_[{model, version}];
  if (s.name.empty()) {
    s.name = model;
    s.version = version;
  }
  return s;
}

void StatsBook::OnInference(const std::string& model, const std::string& version, bool ok,
                            double seconds, int64_t images, double queue_seconds, uint64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ModelStats& s = At(model, version);
  s.last_inference_ms = now_ms;
  if (!ok) {
    s.fail.Add(seconds);
    return;
  }
  s.success.Add(seconds);
  s.queue.Add(queue_seconds);
  s.inference_count += static_cast<uint64_t>(images > 0 ? images : 0);
}

void StatsBook::OnExecution(const std::string& model, const std::string& version, int64_t batch,
                            double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ModelStats& s = At(model, version);
  ++s.execution_count;
  s.compute_infer.Add(seconds);
  s.batches[static_cast<uint64_t>(batch)].Add(seconds);
}

std::vector<ModelStats> StatsBook::Of(
    const std::vector<std::pair<std::string, std::string>>& served) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ModelStats> out;
  for (const auto& [name, version] : served) {
    const auto it = stats_.find({name, version});
    if (it != stats_.end()) {
      out.push_back(it->second);
    } else {
      ModelStats s;
      s.name = name;
      s.version = version;
      out.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace krause::server
