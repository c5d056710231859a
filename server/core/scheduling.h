// The serving schedulers' decisions as pure functions of (state, now): which classify requests
// form the next batch and when to look again; how a generator's worker splits its time between
// decode steps and side work (prefills of newly admitted requests, Score jobs). The worker
// threads (classify_batcher.cc, generator_worker.cc) only snapshot their state, call these and
// carry the plan out, so tests can assert exact plans with a fake clock and no thread.
//
// Policies, in short:
//   Classify: natural batching. An idle batcher runs a request at once; requests that arrive
//     while a batch runs form the next one (whole requests, up to max_batch_size images, in the
//     fair order below). max_queue_delay (default 0) opts into waiting for company: a batch that
//     is not full then starts when its oldest request has waited that long. Expired and
//     cancelled requests are dropped before a batch forms, wherever they are in the queue.
//     The fair order between tenants (tenants.h) is start-time fair queueing on images: each
//     tenant has a virtual time that a request of n images advances by n / weight; the next
//     request taken is the next one of the tenant whose virtual time is least (a tenant that had
//     nothing queued starts from the virtual time of the last request taken, so idling earns no
//     credit; ties go to the tenant whose next request is oldest). A tenant's next request is its
//     highest-priority one, the oldest of those. So a tenant's share of a saturated model
//     follows its weight, not the number of calls it keeps queued. While the packed CPU forward
//     computes a batch, requests of tenants behind it cut in between two images
//     (PlanClassifyCutIn), so a client with one call waits for an image, not for a whole batch
//     (elsewhere, at most the batch running and its own).
//   Generator: while sequences decode, side work (prefills and Score chunks) may use at most
//     `side_share` (a third) of the worker's time, accounted by SideWorkCredit from measured
//     durations (WorkerLedger keeps the credit and the measured costs); who is admitted follows
//     the engine's one rule, PlanAdmission (model/engine/admission.h), within the budget decided
//     here: the tenant holding the fewest slots for its weight goes first (its highest priority,
//     oldest image), so tenants share a full generator's slots, and so its images/s, by weight.
//     Each side unit is bounded (a prefill; a Score chunk sized to the credit), so a burst of
//     completion prompts or a stream of Score jobs slows running streams by a bounded factor
//     instead of stalling them. With nothing decoding, side work takes a slice per iteration
//     (admissions first: the first admitted streams start at once, the rest join under the
//     credit; Score chunks of about a slice, so that a Generate arriving between two chunks waits
//     for one chunk, not for a whole Score job; a chunk costs about as much per image as a whole
//     job: krause-model-bench score).
//
// Thread-safety: pure functions and value types.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "model/engine/admission.h"
#include "server/core/defaults.h"

namespace krause::server {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Classify

struct QueuedClassify {
  int64_t images = 0;
  Clock::time_point enqueued;
  Clock::time_point deadline = Clock::time_point::max();
  bool cancelled = false;  // the caller's cancellation, polled into the snapshot
  int32_t tenant = 0;      // tenants.h: its index, weight and the call's priority
  double weight = 1;
  int priority = 0;
};

// The fair order's state between two batches: each tenant's virtual time (by tenant index;
// missing: 0) and the virtual time of the last request taken.
struct FairClock {
  std::vector<double> tenant;
  double last = 0;

  // Tenant `t`'s virtual time (0 when missing).
  double Of(int32_t t) const {
    return static_cast<size_t>(t) < tenant.size() ? tenant[static_cast<size_t>(t)] : 0.0;
  }
  // A request of `images` of tenant `t` (its `weight`) taken at virtual time `start`.
  void Charge(int32_t t, double start, int64_t images, double weight) {
    if (static_cast<size_t>(t) >= tenant.size()) tenant.resize(static_cast<size_t>(t) + 1, 0.0);
    tenant[static_cast<size_t>(t)] = start + static_cast<double>(images) / weight;
  }
};

struct ClassifyPlanOptions {
  int64_t max_batch_size = defaults::kMaxBatchSize;
  Clock::duration max_queue_delay{0};
};

struct ClassifyPlan {
  struct Drop {
    size_t index;  // into the queue snapshot
    absl::Status why;
  };
  std::vector<Drop> drop;
  // The batch: queue indices (oldest first), none when nothing is due.
  std::vector<size_t> take;
  // When nothing is taken: when to plan again unless new work or a stop arrives first
  // (Clock::time_point::max(): only then).
  Clock::time_point wake_at = Clock::time_point::max();
  FairClock clock;  // the fair order's state once `take` runs (the one given when none is taken)
  // Each taken request's start (virtual) time, parallel to `take`: a batch runs its requests in
  // this order, and the start of the one being computed is the virtual time a cut-in
  // (PlanClassifyCutIn) is measured against.
  std::vector<double> start;
};

// `stopping`: everything queued is dropped with UNAVAILABLE. `clock`: the state the previous
// plan that took a batch returned.
ClassifyPlan PlanClassifyBatch(const std::vector<QueuedClassify>& queue, Clock::time_point now,
                               const ClassifyPlanOptions& options, bool stopping = false,
                               const FairClock& clock = {});

// Between two images of a running batch (the packed CPU forward: ClassifyBatcher), queued
// requests of tenants behind the batch in the fair order cut in: they are computed at once, on
// their own, instead of waiting for the batch and the next; so a client with one call waits for
// an image, not for another tenant's batch. Before a batch forms, the same rule picks the
// requests left out of it, to cut in at its first images.
// `virtual_now`: the start time of the batch's request being computed (between two batches: the
// greatest virtual time of the last batch's tenants, where it ended). `batch_tenants` (by tenant
// index; missing: no): the tenants of that batch, who never cut in. Another tenant's head
// request cuts in when the tenant's virtual time is at most `virtual_now` (it has had no more
// than its share up to the point the batch has reached; a tie goes to it, as the batch's
// requests were ordered without it; a tenant that cut in a moment ago is past it until the
// batch catches up), starting at `virtual_now` and advancing the tenant's virtual time by
// images / weight: one request per tenant per plan, and a tenant that keeps cutting in gets no
// more than its weight's share of the batch's progress. Whole requests, the least virtual time
// first (ties: the older), up to `max_images` (the first that does not fit ends the plan);
// expired and cancelled requests are left to the next PlanClassifyBatch, which drops them.
// `take`, `start` and `clock` as PlanClassifyBatch's (`clock.last` unchanged); never `drop`.
ClassifyPlan PlanClassifyCutIn(const std::vector<QueuedClassify>& queue, Clock::time_point now,
                               double virtual_now, int64_t max_images, const FairClock& clock,
                               const std::vector<char>& batch_tenants);
// An arriving Classify request: run it on the arriving (RPC) thread at once, or queue it for the
// batcher thread. Running it here skips the batcher thread's wake-up (measured ~0.07 ms of a
// ~1.2 ms call at concurrency 1) and changes no batch: it is only chosen when nothing is queued,
// no batch is running, no queue delay asks to wait for company, and the batcher runs the packed
// CPU forward (a GPU batcher keeps its own stream and thread), and only for a forward of at most
// kMaxArrivalFlops: a larger one (a paper-size ViT-S/16 image is 8.6 GFLOP) spreads over the
// intra-op threads, and every RPC thread that ran one would keep a team of OpenMP threads of its
// own that spin against the team computing (measured: a ViT-S/16 served at concurrency 1 at
// about 0.7 of its forward's speed); one wake-up of the batcher thread is nothing beside it.
// While it runs, arrivals queue and form the next batch as usual (the batch counts as running).
inline constexpr double kMaxArrivalFlops = 1e9;
struct ClassifyArrival {
  bool queue_empty = true;
  bool batch_running = false;
  bool stopping = false;
  bool caller_may_run = false;  // the packed CPU forward
  Clock::duration max_queue_delay{0};
  int64_t images = 0;  // the arriving request's
  int64_t max_batch_size = defaults::kMaxBatchSize;
  double flops = 0;  // the arriving request's forward
};
bool RunOnArrival(const ClassifyArrival& arrival);

// A batcher's side work (the Inspect RPC: one forward of its own, never batched). Side jobs
// queue apart from the batches and run one at a time on the batcher thread, taking turns with
// the batches: after a batch, a waiting side job runs before the next batch; after a side job,
// a due batch runs before the next side job; with no batch due, side jobs run back to back. So a
// Classify request waits for at most one side job's compute, and a side job for at most one
// batch. Expired and cancelled side jobs are dropped, as requests are.
struct QueuedSide {
  Clock::time_point deadline = Clock::time_point::max();
  bool cancelled = false;
};

struct SidePlan {
  std::vector<ClassifyPlan::Drop> drop;  // indices into the side-job snapshot
  bool run = false;                      // run the oldest live side job now (instead of a batch)
  size_t index = 0;                      // ... this one
};

// `batch_due`: the classify plan took a batch; `last_was_side`: the batcher's previous unit of
// work was a side job. `stopping`: every side job is dropped with UNAVAILABLE.
SidePlan PlanSideWork(const std::vector<QueuedSide>& side, Clock::time_point now, bool batch_due,
                      bool last_was_side, bool stopping = false);

// ---------------------------------------------------------------------------------------------
// Generator worker

struct GeneratorSchedulingOptions {
  // Share of the worker's time side work may take while sequences decode, in (0, 1]. A third:
  // a running stream keeps two thirds of the worker (a 1-image Generate beside six clients
  // sending Score back to back took 3.0x its idle time at one half, bench/serving_bench.py).
  double side_share = 1.0 / 3.0;
  // Largest side-work credit kept between bursts, and the side work an idle worker does
  // between two looks at its queues.
  double side_slice_seconds = 0.005;
  // How long after a tenant's image finished the part of its weighted share of the slots it
  // neither holds nor asks for is kept for it (its client's next call is on the way;
  // PlanAdmission's `expected`). Long enough for a reply and the next call to cross a busy
  // host, short beside an image's generation.
  double return_window_seconds = 0.05;
};

// Side-work credit, in seconds: a decode step of t seconds earns t * share / (1 - share)
// (capped at the slice); side work of t seconds spends t. Side work may start while the credit is
// positive, so over a long run it takes at most `side_share` of the time (one unit may
// overdraw it; decode steps then run until it is positive again).
class SideWorkCredit {
 public:
  explicit SideWorkCredit(const GeneratorSchedulingOptions& o);
  void OnDecode(double seconds);
  void OnSideWork(double seconds);
  double seconds() const { return credit_; }

 private:
  double ratio_, cap_;
  double credit_;
};

struct WorkerState {
  int64_t decoding = 0;  // sequences holding a slot
  int64_t free_slots = 0;
  std::vector<WaitingRequest> waiting;  // oldest first (DecodeEngine::Waiting)
  std::vector<GroupSlots> held;         // slots held by tenant (DecodeEngine::HeldSlots)
  std::vector<FairShare> expected;      // tenants expected back (WorkerLedger::Fill)
  // Images left in the oldest Score job (0: none queued).
  int64_t score_images_left = 0;
  double credit_seconds = 0;  // SideWorkCredit::seconds()
  // Measured costs (0 while unknown: a unit is then assumed to fit the slice).
  double seconds_per_prefill_token = 0;
  double seconds_per_score_image = 0;
};

struct WorkerPlan {
  AdmissionPlan admission;   // the waiting requests this iteration's step admits (prefills)
  int64_t score_images = 0;  // images of the oldest Score job to score now (one chunk)
  bool step = false;         // run an engine step (admits `admission`, decodes every active one)
};

WorkerPlan PlanWorkerIteration(const WorkerState& state, const GeneratorSchedulingOptions& options);

// What a generator worker has earned and measured: the side-work credit, and the smoothed cost
// of a prefill position and of a Score image (an exponential average, 0.7 old + 0.3 new; 0 until
// measured). The worker reports each unit of work it ran; Fill() puts the figures into the next
// WorkerState. `decoding`: whether sequences were decoding when the unit started (only then does
// side work spend credit).
class WorkerLedger {
 public:
  explicit WorkerLedger(const GeneratorSchedulingOptions& options)
      : credit_(options),
        window_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(options.return_window_seconds))) {}
  // An image of `share`'s tenant finished at `now` (its client may be back for more).
  void OnDone(const FairShare& share, Clock::time_point now);
  void OnScore(double seconds, int64_t images, bool decoding);
  // An engine step: its prefills (positions and seconds) and its decode step's seconds.
  void OnStep(int64_t prefill_tokens, double prefill_seconds, double decode_seconds, bool decoding);
  // The credit, the costs, and the tenants expected back at `now`: those with an image
  // finished within return_window_seconds.
  void Fill(WorkerState* state, Clock::time_point now) const;

 private:
  SideWorkCredit credit_;
  Clock::duration window_;
  std::map<int32_t, std::pair<FairShare, Clock::time_point>> done_;  // the last, by tenant
  double seconds_per_prefill_token_ = 0, seconds_per_score_image_ = 0;
};

}  // namespace krause::server
