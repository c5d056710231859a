// The worker of one generator: owns its DecodeEngine and the one thread that runs it. Between
// decode steps it also runs Score jobs (teacher-forced bits/dim), in chunks of a few images, so
// RPC threads never run a model. Each iteration follows PlanWorkerIteration (scheduling.h):
// while sequences decode, prefills and Score chunks take at most a share of the worker's time,
// so neither a burst of completion prompts nor a stream of Score jobs stalls running streams;
// WorkerLedger keeps what that needs (credit, measured costs).
//
// Results flow one way: the engine's StepOutput (ids) -> this worker, which routes it to the
// call that submitted each image -> that call's GenerationReceiver, once per iteration with
// everything the iteration did to its images (a CallUpdate in the call's own image indices).
// A call cancels by telling the worker (Cancel), never the engine.
//
// Thread-safety: everything public may be called from any thread. Receivers and the on_step
// hook run on the worker thread and must not block.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "model/engine/decode_engine.h"
#include "model/pixel_model.h"
#include "server/core/defaults.h"
#include "server/core/scheduling.h"
#include "server/core/tenants.h"

namespace krause::server {

// What one worker iteration did to one call's images. `image` is the index of the image in the
// call's Submit.
struct CallUpdate {
  struct Pixel {
    int64_t image = 0, index = 0;  // index: the subpixel's position in the image
    uint8_t value = 0;
  };
  struct Done {
    int64_t image = 0;
    absl::Status status;  // OK, Cancelled (by the call, or the worker stopping), Internal
  };
  Clock::time_point now;          // when the iteration ended
  Clock::time_point admitted_at;  // when its step began admitting (for `admitted`)
  std::vector<int64_t> admitted;  // images that got their cache slots
  std::vector<Pixel> pixels;      // new subpixels, each image's in order
  std::vector<Done> done;         // images that left the engine
  bool stopping = false;          // the worker is stopping (it cancelled every image)
  void Clear();
};

// The receiving end of one call's images (GenerateCall implements it).
class GenerationReceiver {
 public:
  virtual ~GenerationReceiver() = default;
  // On the worker thread after every iteration, from the first after Submit until the one in
  // which the call's last image is done (also when nothing changed for the call: it checks its
  // deadline and pacing then). Must not block.
  virtual void OnUpdate(const CallUpdate& update) = 0;
};

struct ScoreJob {
  at::Tensor images;            // [n, seq_len] uint8 raster order
  std::vector<int64_t> labels;  // empty, or per image its class (-1: none); validated
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::function<bool()> cancelled;
  std::function<void(absl::StatusOr<std::vector<double>> bits_per_dim)> done;
  // Instead of bits/dim (the Inspect RPC): this work, run as one chunk of the job's images (their
  // time counted as Score images' against the side-work budget), with the model and its serving
  // implementation; `done` then gets its status and no bits.
  std::function<absl::Status(const PixelModel& model, KrauseImpl impl)> work;
};

// One engine step, as the worker saw it (for metrics).
struct DecodeEvent {
  int64_t version = 0;  // the served model's (set by ServedGenerator)
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

  // Submits one call's images, all or none, to be reported to `receiver` (which the worker holds
  // until the call's last image is done), for `share`'s tenant at its priority: the images'
  // GenerationRequest::share is set from it, so admissions share the cache slots between tenants
  // by weight (within max_slots) and order a tenant's images by priority (admission.h).
  // UNAVAILABLE when the waiting room would overflow or the worker is stopping;
  // RESOURCE_EXHAUSTED (TenantRefusal) when the tenant already has max_queued calls with images
  // waiting for a slot; InvalidArgument from the engine's validation, or when `receiver` is null
  // or already has images running.
  absl::Status Submit(std::vector<GenerationRequest> images,
                      std::shared_ptr<GenerationReceiver> receiver, const Share& share = {});
  // Every unfinished image of the receiver's call leaves at the next step (Cancelled). No effect
  // once they are done.
  void Cancel(const GenerationReceiver* receiver);
  absl::Status EnqueueScore(ScoreJob job);
  // Cancels every image (the receivers see `stopping`), fails queued score jobs with
  // UNAVAILABLE, runs the engine until idle and joins the thread.
  void Stop();

  int64_t active() const { return active_.load(); }
  // Cache slots held (a guided sequence holds two).
  int64_t slots_in_use() const { return slots_in_use_.load(); }
  int64_t waiting() const { return waiting_.load(); }
  // Calls with an image waiting for a slot, by tenant index.
  std::vector<int64_t> tenant_queued_calls() const;
  int64_t slots() const { return slots_; }
  int64_t bytes_per_sequence() const { return bytes_per_sequence_; }
  // The engine's precision (after a fallback) and why it fell back (DecodeEngine).
  Precision precision() const { return engine_->precision(); }
  const std::string& precision_fallback() const { return engine_->precision_fallback(); }
  // The packed CPU step's linear kernels (CpuDecoder::linear_kernels); empty without one.
  std::string linear_kernels() const {
    return engine_->cpu_decoder() != nullptr ? engine_->cpu_decoder()->linear_kernels() : "";
  }

 private:
  GeneratorWorker(std::shared_ptr<const PixelModel> model, std::unique_ptr<DecodeEngine> engine,
                  const GeneratorOptions& options, std::function<void(const DecodeEvent&)> on_step);
  struct RunningScore {
    ScoreJob job;
    int64_t done = 0;  // images scored so far
    std::vector<double> bits;
  };
  // One Submit: its receiver, its images' engine ids, what this iteration did to them.
  struct Call {
    std::shared_ptr<GenerationReceiver> receiver;
    std::vector<int64_t> ids;  // by image
    int64_t unfinished = 0;
    int64_t waiting = 0;  // images not yet admitted (nor done)
    FairShare share;      // its tenant's, as its images carry it
    CallUpdate update;    // worker thread only
  };
  void Loop();
  // Calls with an image waiting for a slot, by tenant index (under mu_).
  std::vector<int64_t> TenantQueuedCallsLocked() const;
  // Ends queued Score jobs that were cancelled, expired or (stopping) refused.
  void DropScores(std::deque<RunningScore>* scores, bool stopping);
  // Scores one chunk of the oldest job (the plan's size); reports its cost to the ledger.
  void ScoreChunk(std::deque<RunningScore>* scores, int64_t images, bool decoding,
                  WorkerLedger* ledger, DecodeEvent* event);
  // Routes a step's output to the calls, hands every live call its update, and forgets the calls
  // whose images are all done.
  // Tells `ledger` of the tenants whose images finished.
  void Deliver(const StepOutput& out, Clock::time_point step_start, bool stopping,
               WorkerLedger* ledger);

  const std::shared_ptr<const PixelModel> model_;
  const std::unique_ptr<DecodeEngine> engine_;
  const GeneratorOptions options_;
  const std::function<void(const DecodeEvent&)> on_step_;
  const int64_t slots_;
  const int64_t bytes_per_sequence_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // The live calls in the order they came (updates go out in that order: a running stream's
  // flush is not queued behind a burst of newer calls'), each call by its receiver, and per
  // engine id its call and image index. Written by Submit and the worker thread under mu_; a
  // Call's `update` is the worker thread's alone.
  std::map<int64_t, Call> calls_;
  std::unordered_map<const GenerationReceiver*, int64_t> call_of_;
  struct ImageRef {
    Call* call = nullptr;
    int64_t image = 0;      // its index in the call
    bool admitted = false;  // it got its cache slots
  };
  std::unordered_map<int64_t, ImageRef> images_;
  int64_t next_call_ = 0;
  std::deque<ScoreJob> scores_;
  bool stopping_ = false;
  bool wake_ = false;
  std::atomic<int64_t> active_{0}, waiting_{0}, slots_in_use_{0};
  std::atomic<int64_t> score_jobs_{0};  // accepted Score jobs not yet done
  std::thread thread_;
};

}  // namespace krause::server
