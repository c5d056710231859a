// krause-loadgen's common parts: what the calls are built from (LoadOptions), what they measure
// (Stats), and LoadGen, which starts each call through the protocol's Driver and counts the calls
// in flight. The drivers, one a protocol, are loadgen_krause.cc (krause.v1), loadgen_oip.cc (the
// Open Inference Protocol over gRPC) and loadgen_http.cc (REST infer and generate_stream);
// loadgen_report.cc writes the report; loadgen_main.cc reads the flags and runs the load.
// Thread-safety: LoadGen::Issue from any thread; the calls end on gRPC or HTTP threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "client/connection.h"
#include "krause/v1/krause.grpc.pb.h"

namespace krause::loadgen {

namespace v1 = krause::v1;
using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The flags the calls are built from (loadgen_main.cc's, read once).
struct LoadOptions {
  std::string workload = "classify";  // classify, generate, complete, score, getmodel or mix
  double mix_classify = 0.8;          // mix: the fraction of calls that are Classify
  std::string classify_model;         // empty: the default classifier
  std::string generate_model;         // empty: the default generator
  int images_per_request = 1;         // Classify and Score
  int prompt_rows = 14;               // complete
  int update_interval_ms = 50;        // Generate
  int generate_images = 1;            // Generate
  bool resume = false;                // Generate through client::ResumingGenerate
  bool http_binary = false;           // --protocol http, classify: binary tensor data
  int priority = 0;                   // krause.v1's Classify and Generate priority
};

struct Stats {
  std::mutex mu;
  std::map<std::string, std::vector<double>> latency;  // rpc -> seconds (OK calls)
  std::vector<double> first_chunk, first_pixel, chunk_gap;
  std::map<std::string, std::map<std::string, int64_t>> codes;  // rpc -> code -> calls
  int64_t images = 0;
  int64_t measured_done = 0;
  // --resume: breaks survived, calls made to continue them, rows sampled again.
  int64_t resumed_streams = 0, resume_calls = 0, rows_recomputed = 0;
  Clock::time_point last_done{};           // when the last measured call ended
  std::vector<std::string> error_samples;  // --protocol http: the first distinct errors
};

class LoadGen;

// One protocol's calls. Issue starts call number `n` of the workload (`classify`: Classify where
// the workload is mix or classify; `k`: images per Classify or Score call); when it ends the
// driver records it (LoadGen::Record) and calls LoadGen::Ended with `done`.
class Driver {
 public:
  virtual ~Driver() = default;
  virtual void Issue(uint64_t n, bool classify, int k, bool measured,
                     std::function<void()> done) = 0;
};

class LoadGen {
 public:
  LoadGen(LoadOptions options, krause::client::ConnectionOptions conn,
          std::vector<v1::Image> images);

  // The driver the calls go through (set once, before the first Issue).
  void SetDriver(std::unique_ptr<Driver> driver) { driver_ = std::move(driver); }

  // Starts one call; `done` runs when it ends (on a gRPC thread).
  void Issue(bool measured, std::function<void()> done);

  const LoadOptions& options() const { return options_; }
  const krause::client::ConnectionOptions& conn() const { return conn_; }
  // The n-th test image (they repeat).
  const v1::Image& image(uint64_t n) const { return images_[n % images_.size()]; }
  // --classify_model, or the default classifier's name where it is empty.
  const std::string& classify_model_name() const { return model_name_; }

  // Counts a call that ended, if `measured`: its code, and its latency and `images` if OK.
  void Record(const char* rpc, bool measured, const grpc::Status& st, double seconds,
              int64_t images);
  void Record(const char* rpc, bool measured, const std::string& code, double seconds,
              int64_t images);
  // The first few distinct errors, for the report (what an HTTP status alone does not say).
  void NoteError(const std::string& what);
  // A call has ended: runs `done`, then drops the count in flight. `done` first: once in_flight()
  // reads 0 the main thread may return and destroy what `done` refers to.
  void Ended(const std::function<void()>& done) {
    done();
    in_flight_.fetch_sub(1);
  }

  // One asynchronous unary call of `req`, started by `start(ctx, req, resp, callback)` (the
  // stub's async method); when it ends it is recorded under `rpc`, with `images` counted if OK.
  template <typename Resp, typename Req, typename Start>
  void Unary(const char* rpc, Req req, int64_t images, bool measured, std::function<void()> done,
             Start start) {
    struct Call {
      grpc::ClientContext ctx;
      Req req;
      Resp resp;
      Clock::time_point start;
    };
    auto* c = new Call;
    krause::client::PrepareContext(conn_, &c->ctx);
    c->req = std::move(req);
    c->start = Clock::now();
    start(&c->ctx, &c->req, &c->resp,
          std::function<void(grpc::Status)>(
              [this, c, rpc, images, measured, done = std::move(done)](grpc::Status st) {
                Record(rpc, measured, st, Seconds(Clock::now() - c->start), st.ok() ? images : 0);
                delete c;
                Ended(done);
              }));
  }

  // Call `n`'s Generate request (seed n * 1000), completing `prompt` where it is not null.
  v1::GenerateRequest GenerateRequest(uint64_t n, const v1::Image* prompt) const;

  Stats& stats() { return stats_; }
  int64_t in_flight() const { return in_flight_.load(); }

 private:
  const LoadOptions options_;
  const krause::client::ConnectionOptions conn_;
  const std::vector<v1::Image> images_;
  const std::string model_name_;
  std::unique_ptr<Driver> driver_;
  std::atomic<uint64_t> counter_{0};
  std::atomic<int64_t> in_flight_{0};
  std::mutex rng_mu_;
  std::mt19937_64 rng_{12345};
  Stats stats_;
};

}  // namespace krause::loadgen
