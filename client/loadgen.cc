// krause-loadgen's LoadGen (loadgen.h): which call comes next (the workload, mix's draw), the
// measurements every driver records into, and krause.v1's Generate request, which the HTTP driver
// sends as JSON too.
#include "client/loadgen.h"

#include <algorithm>

#include "server/edge/status.h"

namespace krause::loadgen {

LoadGen::LoadGen(LoadOptions options, krause::client::ConnectionOptions conn,
                 std::vector<v1::Image> images)
    : options_(std::move(options)),
      conn_(std::move(conn)),
      images_(std::move(images)),
      model_name_(options_.classify_model.empty() ? "krause-vit-fmnist" : options_.classify_model) {
}

void LoadGen::Issue(bool measured, std::function<void()> done) {
  in_flight_.fetch_add(1);
  const uint64_t n = counter_.fetch_add(1);
  const std::string& w = options_.workload;
  bool classify = w == "classify";
  if (w == "mix") {
    std::lock_guard<std::mutex> l(rng_mu_);
    classify = std::uniform_real_distribution<double>(0, 1)(rng_) < options_.mix_classify;
  }
  const int k = std::max(1, options_.images_per_request);
  driver_->Issue(n, classify, k, measured, std::move(done));
}

void LoadGen::NoteError(const std::string& what) {
  std::lock_guard<std::mutex> l(stats_.mu);
  if (stats_.error_samples.size() < 5 &&
      std::find(stats_.error_samples.begin(), stats_.error_samples.end(), what) ==
          stats_.error_samples.end())
    stats_.error_samples.push_back(what);
}

void LoadGen::Record(const char* rpc, bool measured, const grpc::Status& st, double seconds,
                     int64_t images) {
  Record(rpc, measured, krause::server::GrpcCodeName(st.error_code()), seconds, images);
}

void LoadGen::Record(const char* rpc, bool measured, const std::string& code, double seconds,
                     int64_t images) {
  if (!measured) return;
  std::lock_guard<std::mutex> l(stats_.mu);
  stats_.codes[rpc][code] += 1;
  if (code == "OK") {
    stats_.latency[rpc].push_back(seconds);
    stats_.images += images;
  }
  ++stats_.measured_done;
  stats_.last_done = Clock::now();
}

v1::GenerateRequest LoadGen::GenerateRequest(uint64_t n, const v1::Image* prompt) const {
  v1::GenerateRequest req;
  req.set_model(options_.generate_model);
  req.set_num_images(static_cast<uint32_t>(std::max(1, options_.generate_images)));
  req.set_seed(n * 1000);
  req.set_update_interval_ms(static_cast<uint32_t>(options_.update_interval_ms));
  req.set_priority(static_cast<uint32_t>(options_.priority));
  if (prompt != nullptr) {
    *req.mutable_prompt() = *prompt;
    req.set_prompt_rows(static_cast<uint32_t>(options_.prompt_rows));
  }
  return req;
}

}  // namespace krause::loadgen
