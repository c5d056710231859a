// The dynamic batcher of one classifier: requests (each a few images of the model's shape) queue
// up; one worker thread forms batches as PlanClassifyBatch (scheduling.h) decides: natural
// batching (an idle batcher runs a request at once, requests arriving meanwhile form the next
// batch, the oldest whole requests up to max_batch_size images), with max_queue_delay as an
// opt-in wait for company. It runs ONE forward per batch and hands each request its rows of the
// probabilities. While the packed CPU forward computes a batch image by image, requests of
// tenants behind the batch in the fair order cut in between two images (PlanClassifyCutIn):
// the thread about to take the batch's next image computes them first, on its own, and replies
// at once, so a tenant with one call waits for an image, not for another tenant's whole batch,
// and the batch loses nothing but the cut-ins' own compute. RPC threads enqueue; an idle CPU
// batcher without a queue delay runs an arriving request on the arriving thread itself
// (RunOnArrival: no batch changes, one wake-up less; no cut-ins into it).
//
// Requests whose deadline passed or whose caller cancelled are dropped before a batch forms
// (DEADLINE_EXCEEDED / CANCELLED). A full queue refuses with UNAVAILABLE, a tenant at its
// max_queued with RESOURCE_EXHAUSTED. Batches are filled in the fair order between tenants and
// by priority within one (scheduling.h). Stop() fails what is still queued with UNAVAILABLE and
// joins the thread.
//
// Thread-safety: Enqueue and the accessors from any thread; callbacks run on the worker thread
// (a cut-in's, and its on_batch event, on one of the forward's intra-op threads, concurrently
// with other cut-ins') or inside Enqueue.
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
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/engine/device_context.h"
#include "model/vit.h"
#include "model/vit_cpu.h"
#include "server/core/defaults.h"
#include "server/core/scheduling.h"
#include "server/core/tenants.h"

namespace krause::server {

using Clock = std::chrono::steady_clock;

struct ClassifyJob {
  at::Tensor images;  // [n, C, H, W] uint8 on the CPU, 1 <= n <= max_batch_size
  Share share;        // its tenant and priority: the batches' fair order (scheduling.h)
  Clock::time_point deadline = Clock::time_point::max();
  std::function<bool()> cancelled;  // polled before the job joins a batch (may be empty)
  // Softmax probabilities [n, classes] (float, CPU), or the reason the job did not run.
  // `queue_seconds`: time from Enqueue to the start of its forward. Runs on the batcher thread (a
  // cut-in: on the intra-op thread that computed it), or on the thread that called Enqueue
  // (RunOnArrival), before Enqueue returns. `reply_here`: the batcher's advice to reply on this
  // thread (nothing queued waits for it, or the request cut in, so its reply should not queue
  // behind a batch's) rather than hand the reply to another thread.
  std::function<void(absl::StatusOr<at::Tensor>, double queue_seconds, bool reply_here)> done;
};

// Work beside the batches (the Inspect RPC): one forward of its own on the batcher thread (the
// model's device and stream), between two batches as PlanSideWork (scheduling.h) decides.
struct SideJob {
  Clock::time_point deadline = Clock::time_point::max();
  std::function<bool()> cancelled;  // polled while the job waits (may be empty)
  std::function<absl::Status(const ViT& model)> work;
  // `work`'s status, or the reason it did not run (UNAVAILABLE stopping, DEADLINE_EXCEEDED,
  // CANCELLED, INTERNAL when it threw). On the batcher thread.
  std::function<void(absl::Status)> done;
};

struct BatchingOptions {
  int64_t max_batch_size = defaults::kMaxBatchSize;
  std::chrono::microseconds max_queue_delay{0};  // 0: natural batching only
  int64_t max_queued_images = defaults::kMaxQueuedImages;
  // The serving implementation of the LibTorch forward (no packed forward): kWindowed runs the
  // windowed operator, anything else the device's kernel (ForwardImpl).
  KrauseImpl attention_impl = KrauseImpl::kAuto;
};

// What the batcher did with one forward: a batch, or a request that cut in (for metrics and
// tests).
struct BatchEvent {
  int64_t version = 0;  // the served model's (set by ServedClassifier)
  int64_t images = 0;
  int64_t requests = 0;
  double compute_seconds = 0;
};

class ClassifyBatcher {
 public:
  // `packed`: the model's packed CPU forward (vit_cpu.h), which a CPU batcher runs; null on a GPU
  // (and for tests of the LibTorch path), where batches run ViT::Forward.
  ClassifyBatcher(std::shared_ptr<const ViT> model, std::string device, BatchingOptions options,
                  std::function<void(const BatchEvent&)> on_batch = {},
                  std::shared_ptr<const CpuViT> packed = nullptr);
  ~ClassifyBatcher();
  ClassifyBatcher(const ClassifyBatcher&) = delete;
  ClassifyBatcher& operator=(const ClassifyBatcher&) = delete;

  // Queues the job, or returns UNAVAILABLE (queue full / stopped) or RESOURCE_EXHAUSTED (its
  // tenant has max_queued jobs queued here) without calling `done`.
  absl::Status Enqueue(ClassifyJob job);
  // Queues a side job (at most kMaxSideJobs waiting), or returns UNAVAILABLE without calling
  // `done`.
  absl::Status EnqueueSide(SideJob job);
  static constexpr size_t kMaxSideJobs = 64;
  void Stop();

  int64_t queued_images() const;
  // Calls queued, by tenant index (ModelGauges::tenant_queued_calls).
  std::vector<int64_t> tenant_queued_calls() const;
  const BatchingOptions& options() const { return options_; }

 private:
  struct Entry {
    ClassifyJob job;
    Clock::time_point enqueued;
  };
  static QueuedClassify Snapshot(const Entry& e);      // what the plan sees of a queued job
  std::vector<QueuedClassify> SnapshotLocked() const;  // ... of the queue, in order (under mu_)
  void LeftQueueLocked(const Entry& e);  // `e` left the queue: its counts go (under mu_)
  // The packed CPU forward of `pixels` [n, C, H, W] uint8 contiguous: probabilities [n, classes].
  absl::StatusOr<at::Tensor> PackedForward(const at::Tensor& pixels,
                                           const std::function<void(int64_t)>& before_image) const;
  void Loop();
  // The forward of `batch` (in the plan's order; `start`: the plan's start times) and its
  // replies; on the batcher thread, or on an arriving thread (scheduling.h: RunOnArrival) with a
  // CPU context and `cut_ins` false.
  void RunBatch(std::vector<Entry>& batch, const std::vector<double>& start,
                const DeviceContext& ctx, at::Tensor& staging, bool cut_ins);
  // Between two images of a running batch (on the thread about to compute the next): takes the
  // queued requests that cut in at virtual time `virtual_now` (PlanClassifyCutIn), computes and
  // replies to each.
  void RunCutIns(double virtual_now);
  // Under mu_: the queued requests that cut in at `virtual_now`, out of the queue.
  std::vector<std::pair<Entry, double>> TakeCutInsLocked(double virtual_now);
  // Under mu_: sets cut_in_hint_ again while a queued request may still cut in.
  void RearmCutInLocked();
  void Report(int64_t images, int64_t requests, double compute_seconds) const;

  const std::shared_ptr<const ViT> model_;
  const std::shared_ptr<const CpuViT> packed_;
  const std::string device_;
  const bool packed_cpu_;  // the packed CPU forward runs batches (and may run them on arrival)
  const BatchingOptions options_;
  const std::function<void(const BatchEvent&)> on_batch_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  std::deque<SideJob> side_;
  bool last_was_side_ = false;  // the batcher thread's previous unit of work (under mu_)
  int64_t queued_images_ = 0;
  std::vector<int64_t> tenant_queued_;  // jobs queued, by tenant index
  FairClock clock_;                     // the fair order's state (PlanClassifyBatch)
  bool stopping_ = false;
  bool running_ = false;     // a batch is running (on the batcher thread or an arriving one)
  bool on_arrival_ = false;  // ... on an arriving thread (Stop waits for it)
  // The batcher thread's batch, by tenant index: whether it holds requests of that tenant (an
  // arrival of another tenant may cut in: it sets cut_in_hint_, which the batch's threads poll
  // between images).
  std::vector<char> in_batch_;
  std::atomic<bool> cut_in_hint_{false};
  std::thread thread_;
};

}  // namespace krause::server
