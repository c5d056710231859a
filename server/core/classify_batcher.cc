#include "server/core/classify_batcher.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/engine/device_context.h"
#include "model/util/tensor_checks.h"
#include "server/core/errors.h"
#include "server/core/scheduling.h"

namespace krause::server {
namespace {

// Keeps the entries of `q` not marked in `leaves` (those a plan took out), in order.
template <typename T>
void RemoveMarked(std::deque<T>* q, const std::vector<char>& leaves) {
  std::deque<T> rest;
  for (size_t i = 0; i < q->size(); ++i)
    if (!leaves[i]) rest.push_back(std::move((*q)[i]));
  q->swap(rest);
}

}  // namespace

std::vector<QueuedClassify> ClassifyBatcher::SnapshotLocked() const {
  std::vector<QueuedClassify> out;
  out.reserve(queue_.size());
  for (const Entry& e : queue_) out.push_back(Snapshot(e));
  return out;
}

void ClassifyBatcher::LeftQueueLocked(const Entry& e) {
  queued_images_ -= e.job.images.size(0);
  --tenant_queued_[static_cast<size_t>(e.job.share.tenant)];
}

QueuedClassify ClassifyBatcher::Snapshot(const Entry& e) {
  return {e.job.images.size(0), e.enqueued,
          e.job.deadline,       e.job.cancelled && e.job.cancelled(),
          e.job.share.tenant,   e.job.share.weight(),
          e.job.share.priority};
}

ClassifyBatcher::ClassifyBatcher(std::shared_ptr<const ViT> model, std::string device,
                                 BatchingOptions options,
                                 std::function<void(const BatchEvent&)> on_batch,
                                 std::shared_ptr<const CpuViT> packed)
    : model_(std::move(model)),
      packed_(std::move(packed)),
      device_(std::move(device)),
      packed_cpu_(packed_ != nullptr && at::Device(device_).is_cpu()),
      options_(options),
      on_batch_(std::move(on_batch)) {
  thread_ = std::thread([this] { Loop(); });
}

ClassifyBatcher::~ClassifyBatcher() { Stop(); }

absl::Status ClassifyBatcher::Enqueue(ClassifyJob job) {
  const int64_t n = job.images.size(0);
  bool here = false;
  FairClock clock;  // for a run on arrival: the fair order's state, charged for it
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Refusal("the server is shutting down", reason::kDraining);
    if (queued_images_ + n > options_.max_queued_images)
      return Refusal(
          absl::StrCat("classify queue is full (", queued_images_, " images queued, limit ",
                       options_.max_queued_images, "); retry later"),
          reason::kQueueFull);
    const size_t t = static_cast<size_t>(job.share.tenant);
    if (t >= tenant_queued_.size()) tenant_queued_.resize(t + 1, 0);
    const TenantSpec* spec = job.share.spec.get();
    if (spec != nullptr && spec->max_queued > 0 && tenant_queued_[t] >= spec->max_queued)
      return TenantRefusal(*spec, "max_queued", spec->max_queued,
                           absl::StrCat(tenant_queued_[t], " calls queued for this model"));
    ClassifyArrival arrival;
    arrival.queue_empty = queue_.empty() && side_.empty();
    arrival.batch_running = running_;
    arrival.stopping = stopping_;
    arrival.caller_may_run = packed_cpu_;
    arrival.max_queue_delay = options_.max_queue_delay;
    arrival.images = n;
    arrival.max_batch_size = options_.max_batch_size;
    arrival.flops = packed_ ? static_cast<double>(n) * packed_->flops_per_image() : 0.0;
    here = RunOnArrival(arrival);
    if (here) {
      running_ = on_arrival_ = true;
      clock = clock_;
    } else {
      queued_images_ += n;
      ++tenant_queued_[t];
      queue_.push_back(Entry{std::move(job), Clock::now()});
      // A batch runs without this tenant: the request may cut in (PlanClassifyCutIn decides).
      if (running_ && !on_arrival_ && (t >= in_batch_.size() || !in_batch_[t]))
        cut_in_hint_.store(true, std::memory_order_relaxed);
    }
  }
  if (!here) {
    cv_.notify_one();
    return absl::OkStatus();
  }
  // On the arriving thread (scheduling.h: RunOnArrival); the same expiry rule as a queued
  // request's, then the same forward and replies as a batch of one request.
  std::vector<Entry> batch;
  batch.push_back(Entry{std::move(job), Clock::now()});
  const ClassifyPlan plan = PlanClassifyBatch({Snapshot(batch[0])}, batch[0].enqueued,
                                              {options_.max_batch_size, options_.max_queue_delay},
                                              /*stopping=*/false, clock);
  if (!plan.drop.empty()) {
    batch[0].job.done(plan.drop[0].why, 0.0, true);
  } else {
    static const DeviceContext kCpu{at::Device(at::kCPU)};
    at::Tensor no_staging;
    RunBatch(batch, plan.start, kCpu, no_staging, /*cut_ins=*/false);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = on_arrival_ = false;
    if (!plan.take.empty()) clock_ = plan.clock;
  }
  cv_.notify_all();  // the batcher thread (arrivals meanwhile), and Stop
  return absl::OkStatus();
}

absl::Status ClassifyBatcher::EnqueueSide(SideJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Refusal("the server is shutting down", reason::kDraining);
    if (side_.size() >= kMaxSideJobs)
      return Refusal(
          absl::StrCat("inspect queue is full (", side_.size(), " requests queued); retry later"),
          reason::kQueueFull);
    side_.push_back(std::move(job));
  }
  cv_.notify_one();
  return absl::OkStatus();
}

void ClassifyBatcher::Stop() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    cv_.wait(lock, [&] { return !on_arrival_; });  // a run on an arriving thread ends first
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t ClassifyBatcher::queued_images() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_images_;
}

std::vector<int64_t> ClassifyBatcher::tenant_queued_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tenant_queued_;
}

void ClassifyBatcher::Loop() {
  // The model's device: on a GPU the batcher's own CUDA stream, and a pinned staging buffer
  // for the uploads (the images of a batch are gathered into it, then copied asynchronously).
  const DeviceContext ctx{at::Device(device_)};
  ctx.WaitForDefaultStream();  // the model's upload and conversion ran there
  const std::shared_ptr<void> stream = ctx.Enter();
  const c10::InferenceMode inference;
  at::Tensor staging;
  for (;;) {
    std::vector<Entry> batch, dropped;
    std::vector<double> start;  // the batch's start times (the plan's)
    std::vector<absl::Status> drop_status;
    std::vector<std::pair<SideJob, absl::Status>> side_dropped;
    std::optional<SideJob> side_job;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        // A batch running on an arriving thread: what queues meanwhile is the next batch.
        if (running_ && !stopping_) {
          cv_.wait(lock);
          continue;
        }
        // Snapshot, plan (scheduling.h), carry the plan out.
        const std::vector<QueuedClassify> snapshot = SnapshotLocked();
        const Clock::time_point now = Clock::now();
        const ClassifyPlanOptions options{options_.max_batch_size, options_.max_queue_delay};
        ClassifyPlan plan = PlanClassifyBatch(snapshot, now, options, stopping_, clock_);
        if (!plan.take.empty() && packed_cpu_ &&
            std::find(in_batch_.begin(), in_batch_.end(), 1) != in_batch_.end()) {
          // Requests that would have cut into the last batch had they come a moment earlier stay
          // out of the next one: its threads let them in between its first images and reply at
          // once, instead of at the batch's end. (Before any batch there is nothing to cut into.)
          double end = 0;  // the virtual time the last batch reached
          for (size_t t = 0; t < in_batch_.size(); ++t)
            if (in_batch_[t]) end = std::max(end, clock_.Of(static_cast<int32_t>(t)));
          const ClassifyPlan cut =
              PlanClassifyCutIn(snapshot, now, end, options_.max_batch_size, clock_, in_batch_);
          if (!cut.take.empty()) {
            std::vector<char> out(snapshot.size(), 0);
            for (size_t i : cut.take) out[i] = 1;
            std::vector<size_t> index;  // rest's entries' indices in the snapshot
            std::vector<QueuedClassify> rest;
            for (size_t i = 0; i < snapshot.size(); ++i) {
              if (out[i]) continue;
              index.push_back(i);
              rest.push_back(snapshot[i]);
            }
            ClassifyPlan without = PlanClassifyBatch(rest, now, options, stopping_, clock_);
            if (!without.take.empty()) {  // else they run as the batch, at once
              for (size_t& i : without.take) i = index[i];
              for (ClassifyPlan::Drop& d : without.drop) d.index = index[d.index];
              plan = std::move(without);
            }
          }
        }
        // Side work takes turns with the batches (PlanSideWork).
        std::vector<QueuedSide> side_snapshot;
        side_snapshot.reserve(side_.size());
        for (const SideJob& j : side_)
          side_snapshot.push_back({j.deadline, j.cancelled && j.cancelled()});
        const SidePlan side_plan =
            PlanSideWork(side_snapshot, now, !plan.take.empty(), last_was_side_, stopping_);
        if (!side_plan.drop.empty() || side_plan.run) {
          std::vector<char> out(side_.size(), 0);
          for (const ClassifyPlan::Drop& d : side_plan.drop) {
            out[d.index] = 1;
            side_dropped.emplace_back(std::move(side_[d.index]), d.why);
          }
          if (side_plan.run) {
            out[side_plan.index] = 1;
            side_job = std::move(side_[side_plan.index]);
            plan.take.clear();  // the batch runs after it
          }
          RemoveMarked(&side_, out);
        }
        std::vector<char> leaves(queue_.size(), 0);
        for (const ClassifyPlan::Drop& d : plan.drop) {
          leaves[d.index] = 1;
          dropped.push_back(std::move(queue_[d.index]));
          drop_status.push_back(d.why);
        }
        for (size_t i : plan.take) {
          leaves[i] = 1;
          batch.push_back(std::move(queue_[i]));
        }
        if (!plan.drop.empty() || !plan.take.empty()) {
          RemoveMarked(&queue_, leaves);
          for (const std::vector<Entry>* left : {&dropped, &batch}) {
            for (const Entry& e : *left) LeftQueueLocked(e);
          }
        }
        if (!batch.empty()) {
          clock_ = plan.clock;
          start = plan.start;
          in_batch_.assign(tenant_queued_.size(), 0);
          for (const Entry& e : batch) in_batch_[static_cast<size_t>(e.job.share.tenant)] = 1;
          // What queued before this batch and stays out of it may cut in (PlanClassifyCutIn).
          cut_in_hint_.store(false, std::memory_order_relaxed);
          RearmCutInLocked();
        }
        if (!dropped.empty() || !batch.empty() || side_job || !side_dropped.empty() || stopping_) {
          stop = stopping_ && side_.empty();
          if (!batch.empty() || side_job) running_ = true;
          if (!batch.empty()) last_was_side_ = false;
          if (side_job) last_was_side_ = true;
          break;
        }
        if (plan.wake_at == Clock::time_point::max()) {
          cv_.wait(lock);
        } else {
          cv_.wait_until(lock, plan.wake_at);
        }
      }
    }
    for (size_t i = 0; i < dropped.size(); ++i)
      dropped[i].job.done(drop_status[i], 0.0, queued_images() == 0);
    for (auto& [job, why] : side_dropped) job.done(why);
    if (side_job) {
      absl::Status st;
      try {
        st = side_job->work(*model_);
      } catch (const std::exception& e) {
        st = absl::InternalError(ExceptionMessage(e));
      }
      side_job->done(st);
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      continue;
    }
    if (batch.empty()) {
      if (stop) return;
      continue;
    }
    RunBatch(batch, start, ctx, staging, /*cut_ins=*/true);
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
  }
}

void ClassifyBatcher::Report(int64_t images, int64_t requests, double compute_seconds) const {
  if (!on_batch_) return;
  BatchEvent e;
  e.images = images;
  e.requests = requests;
  e.compute_seconds = compute_seconds;
  on_batch_(e);
}

std::vector<std::pair<ClassifyBatcher::Entry, double>> ClassifyBatcher::TakeCutInsLocked(
    double virtual_now) {
  std::vector<std::pair<Entry, double>> out;
  if (stopping_ || queue_.empty()) return out;
  const ClassifyPlan plan = PlanClassifyCutIn(SnapshotLocked(), Clock::now(), virtual_now,
                                              options_.max_batch_size, clock_, in_batch_);
  if (plan.take.empty()) return out;
  std::vector<char> leaves(queue_.size(), 0);
  for (size_t k = 0; k < plan.take.size(); ++k) {
    Entry& e = queue_[plan.take[k]];
    leaves[plan.take[k]] = 1;
    LeftQueueLocked(e);
    out.emplace_back(std::move(e), plan.start[k]);
  }
  RemoveMarked(&queue_, leaves);
  clock_ = plan.clock;
  return out;
}

void ClassifyBatcher::RearmCutInLocked() {
  // A queued request of a tenant outside the batch whose virtual time is at most the batch's
  // last start may become due before the batch ends: keep the batch's threads looking.
  for (const Entry& e : queue_) {
    const size_t t = static_cast<size_t>(e.job.share.tenant);
    if ((t >= in_batch_.size() || !in_batch_[t]) && clock_.Of(e.job.share.tenant) <= clock_.last) {
      cut_in_hint_.store(true, std::memory_order_relaxed);
      return;
    }
  }
}

absl::StatusOr<at::Tensor> ClassifyBatcher::PackedForward(
    const at::Tensor& pixels, const std::function<void(int64_t)>& before_image) const {
  at::Tensor out = at::empty({pixels.size(0), packed_->classes()}, at::kFloat);
  const absl::Status st =
      packed_->Forward(pixels.data_ptr<uint8_t>(), pixels.size(0), out.data_ptr<float>(),
                       CpuViT::Split::kAuto, before_image);
  if (!st.ok()) return st;
  return out;
}

void ClassifyBatcher::RunCutIns(double virtual_now) {
  std::vector<std::pair<Entry, double>> joining;
  {
    std::lock_guard<std::mutex> lock(mu_);
    joining = TakeCutInsLocked(virtual_now);
    RearmCutInLocked();
  }
  for (auto& [e, start] : joining) {
    // On this thread alone, between two of the batch's images; nothing may escape it.
    const Clock::time_point begin = Clock::now();
    const int64_t n = e.job.images.size(0);
    absl::StatusOr<at::Tensor> probs = absl::InternalError("not run");
    try {
      probs = PackedForward(e.job.images.contiguous(), nullptr);
    } catch (const std::exception& ex) {
      probs =
          absl::InternalError(absl::StrCat("classifier forward failed: ", ExceptionMessage(ex)));
    }
    const double compute = std::chrono::duration<double>(Clock::now() - begin).count();
    Report(n, 1, compute);  // an execution of its own, counted before its reply
    e.job.done(std::move(probs), std::chrono::duration<double>(begin - e.enqueued).count(),
               /*reply_here=*/true);
  }
}

void ClassifyBatcher::RunBatch(std::vector<Entry>& batch, const std::vector<double>& start,
                               const DeviceContext& ctx, at::Tensor& staging, bool cut_ins) {
  const Clock::time_point begin = Clock::now();
  std::vector<at::Tensor> parts;
  for (const Entry& e : batch) parts.push_back(e.job.images);
  absl::StatusOr<at::Tensor> probs;
  try {
    at::Tensor pixels = parts.size() == 1 ? parts[0].contiguous() : at::cat(parts, 0);
    if (packed_ != nullptr && !ctx.cuda()) {
      // The packed CPU forward (vit_cpu.h): no LibTorch op per layer. Between two of its images,
      // requests of tenants behind the batch cut in (RunCutIns), when an arrival hinted at one.
      std::vector<int64_t> first_row;  // each request's first row in the batch
      int64_t rows = 0;
      for (const Entry& e : batch) {
        first_row.push_back(rows);
        rows += e.job.images.size(0);
      }
      const auto before_image = [&](int64_t image) {
        if (!cut_in_hint_.load(std::memory_order_relaxed) || !cut_in_hint_.exchange(false)) return;
        // The virtual time the batch has reached: the start of the request of `image`.
        const size_t k = static_cast<size_t>(
            std::upper_bound(first_row.begin(), first_row.end(), image) - first_row.begin() - 1);
        RunCutIns(k < start.size() ? start[k] : 0.0);
      };
      probs = PackedForward(pixels, cut_ins ? std::function<void(int64_t)>(before_image) : nullptr);
    } else {
      if (ctx.cuda()) {
        if (!staging.defined() || staging.size(0) < pixels.size(0) ||
            staging.scalar_type() != pixels.scalar_type()) {
          std::vector<int64_t> shape = pixels.sizes().vec();
          shape[0] = std::max(pixels.size(0), options_.max_batch_size);
          staging = ctx.HostBuffer(shape, pixels.scalar_type());
        }
        // Reused once this batch's results are back on the host (the copy below waits).
        pixels = staging.narrow(0, 0, pixels.size(0)).copy_(pixels);
      }
      const at::Tensor x =
          NormalizePixels(model_->config(), pixels.to(ctx.device(), /*non_blocking=*/true));
      probs = at::softmax(model_->Forward(x, ForwardImpl(options_.attention_impl)), -1)
                  .to(at::kCPU)
                  .contiguous();
    }
  } catch (const std::exception& e) {
    probs = absl::InternalError(absl::StrCat("classifier forward failed: ", ExceptionMessage(e)));
  }
  const double compute = std::chrono::duration<double>(Clock::now() - begin).count();
  int64_t images = 0;
  for (const Entry& e : batch) images += e.job.images.size(0);
  // Reported before the replies go out, so whoever sees a reply also sees its batch counted.
  Report(images, static_cast<int64_t>(batch.size()), compute);
  const bool reply_here = queued_images() == 0;
  int64_t offset = 0;
  for (Entry& e : batch) {
    const int64_t n = e.job.images.size(0);
    const double queue_s = std::chrono::duration<double>(begin - e.enqueued).count();
    if (probs.ok()) {
      e.job.done(probs->narrow(0, offset, n), queue_s, reply_here);
    } else {
      e.job.done(probs.status(), queue_s, reply_here);
    }
    offset += n;
  }
}

}  // namespace krause::server
