// The worker of one generator: owns its DecodeEngine and the one thread that runs it. Between
// decode steps it also runs Score jobs (teacher-forced bits/dim), in chunks of a few images, so
// RPC threads never run a model. Each iteration follows PlanWorkerIteration (scheduling.h):
// while sequences decode, prefills and Score chunks take at most a share of the worker's time
// (SideWorkCredit), so neither a burst of completion prompts nor a stream of Score jobs stalls
// running streams. After every iteration it calls each registered StepListener on the worker
// thread: streaming calls use it to notice new pixels and their deadline.
//
// Thread-safety: everything public may be called from any thread. Engine callbacks (on_pixel,
// on_done) and listeners run on the worker thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "model/engine/decode_engine.h"
#include "model/pixel_model.h"
#include "server/defaults.h"
#include "server/scheduling.h"

namespace krause::server {

class StepListener {
 public:
  virtual ~StepListener() = default;
  // Called after every engine step (and once when the listener is added). Returns false once the
  // listener needs no more calls; it is then dropped.
  virtual bool AfterStep() = 0;
};

struct ScoreJob {
  at::Tensor images;            // [n, seq_len] uint8 raster order
  std::vector<int64_t> labels;  // empty, or per image its class (-1: none); validated
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::function<bool()> cancelled;
  std::function<void(absl::StatusOr<std::vector<double>> bits_per_dim)> done;
};

// One engine step, as the worker saw it (for metrics).
struct DecodeEvent {
  StepStats stats;
  double seconds = 0;        // wall time of the step (admission prefill included)
  double score_seconds = 0;  // Score work run before the step in the same iteration
  int64_t score_images = 0;
  int64_t active = 0;   // sequences holding a slot after the step
  int64_t waiting = 0;  // sequences waiting for a slot
};

struct GeneratorOptions {
  EngineOptions engine;
  GeneratorSchedulingOptions scheduling;
  // Images waiting for a slot; beyond, Submit is UNAVAILABLE.
  int64_t max_waiting = defaults::kMaxWaiting;
};

class GeneratorWorker {
 public:
  static absl::StatusOr<std::unique_ptr<GeneratorWorker>> Create(
      std::shared_ptr<const PixelModel> model, const GeneratorOptions& options,
      std::function<void(const DecodeEvent&)> on_step = {});
  ~GeneratorWorker();

  // Submits the requests all or none: UNAVAILABLE when the waiting room would overflow or the
  // worker is stopping; InvalidArgument from the engine's validation. Returns their ids.
  absl::StatusOr<std::vector<int64_t>> Submit(std::vector<GenerationRequest> requests);
  void Cancel(int64_t id);
  absl::Status EnqueueScore(ScoreJob job);
  void AddListener(std::shared_ptr<StepListener> listener);
  // Cancels every request (their on_done gets UNAVAILABLE-worthy Cancelled), fails queued score
  // jobs with UNAVAILABLE, runs the engine until idle and joins the thread.
  void Stop();

  int64_t active() const { return active_.load(); }
  // Cache slots held (a guided sequence holds two).
  int64_t slots_in_use() const { return slots_in_use_.load(); }
  int64_t waiting() const { return waiting_.load(); }
  int64_t slots() const { return slots_; }
  int64_t bytes_per_sequence() const { return bytes_per_sequence_; }
  bool stopping() const;

 private:
  GeneratorWorker(std::shared_ptr<const PixelModel> model, std::unique_ptr<DecodeEngine> engine,
                  const GeneratorOptions& options, std::function<void(const DecodeEvent&)> on_step);
  struct RunningScore {
    ScoreJob job;
    int64_t done = 0;  // images scored so far
    std::vector<double> bits;
  };
  void Loop();
  // Ends queued Score jobs that were cancelled, expired or (stopping) refused.
  void DropScores(std::deque<RunningScore>* scores, bool stopping);

  const std::shared_ptr<const PixelModel> model_;
  const std::unique_ptr<DecodeEngine> engine_;
  const GeneratorOptions options_;
  const std::function<void(const DecodeEvent&)> on_step_;
  const int64_t slots_;
  const int64_t bytes_per_sequence_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<int64_t> live_;  // submitted and not yet done
  std::deque<ScoreJob> scores_;
  std::vector<std::shared_ptr<StepListener>> new_listeners_;
  bool stopping_ = false;
  bool wake_ = false;
  std::atomic<int64_t> active_{0}, waiting_{0}, slots_in_use_{0};
  std::atomic<int64_t> score_jobs_{0};  // accepted Score jobs not yet done
  std::thread thread_;
};

}  // namespace krause::server
