#include "server/core/generator_worker.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cstdio>
#include <exception>

#include "absl/strings/str_cat.h"
#include "model/util/tensor_checks.h"
#include "server/core/errors.h"

namespace krause::server {

void CallUpdate::Clear() {
  admitted.clear();
  pixels.clear();
  done.clear();
}

absl::StatusOr<std::unique_ptr<GeneratorWorker>> GeneratorWorker::Create(
    std::shared_ptr<const PixelModel> model, const GeneratorOptions& options,
    std::function<void(const DecodeEvent&)> on_step) {
  auto engine = DecodeEngine::Create(model.get(), options.engine);
  if (!engine.ok()) return engine.status();
  return std::unique_ptr<GeneratorWorker>(
      new GeneratorWorker(std::move(model), std::move(*engine), options, std::move(on_step)));
}

GeneratorWorker::GeneratorWorker(std::shared_ptr<const PixelModel> model,
                                 std::unique_ptr<DecodeEngine> engine,
                                 const GeneratorOptions& options,
                                 std::function<void(const DecodeEvent&)> on_step)
    : model_(std::move(model)),
      engine_(std::move(engine)),
      options_(options),
      on_step_(std::move(on_step)),
      slots_(engine_->pool().capacity()),
      bytes_per_sequence_(engine_->bytes_per_sequence()) {
  thread_ = std::thread([this] { Loop(); });
}

GeneratorWorker::~GeneratorWorker() { Stop(); }

absl::Status GeneratorWorker::Submit(std::vector<GenerationRequest> images,
                                     std::shared_ptr<GenerationReceiver> receiver,
                                     const Share& share) {
  if (images.empty()) return absl::InvalidArgumentError("a call needs at least one image");
  FairShare fair;
  fair.group = share.tenant;
  fair.weight = share.weight();
  fair.max_slots = share.spec != nullptr ? share.spec->max_slots : 0;
  fair.priority = share.priority;
  // Every image is checked before any is queued: all or none.
  for (GenerationRequest& r : images) {
    r.share = fair;
    if (absl::Status st = engine_->Validate(r); !st.ok()) return st;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Refusal("the server is shutting down", reason::kDraining);
    const int64_t n = static_cast<int64_t>(images.size());
    // Every image not yet holding a slot counts as waiting, including this call's.
    const int64_t waiting = static_cast<int64_t>(images_.size()) - active_.load();
    const int64_t free_slots = slots_ - slots_in_use_.load();
    if (waiting + n - free_slots > options_.max_waiting)
      return Refusal(
          absl::StrCat("generator queue is full (", std::max<int64_t>(waiting, 0),
                       " images waiting, ", active_.load(), " of ", slots_,
                       " slots busy, waiting limit ", options_.max_waiting, "); retry later"),
          reason::kQueueFull);
    if (share.spec != nullptr && share.spec->max_queued > 0) {
      const std::vector<int64_t> by_tenant = TenantQueuedCallsLocked();
      const size_t t = static_cast<size_t>(std::max<int32_t>(0, share.tenant));
      const int64_t queued = t < by_tenant.size() ? by_tenant[t] : 0;
      if (queued >= share.spec->max_queued)
        return TenantRefusal(*share.spec, "max_queued", share.spec->max_queued,
                             absl::StrCat(queued, " calls waiting for cache slots"));
    }
    if (receiver == nullptr || call_of_.count(receiver.get()))
      return absl::InvalidArgumentError("a call needs a receiver of its own");
    const int64_t seq = next_call_++;
    Call& call = calls_[seq];
    call.share = fair;
    call_of_[receiver.get()] = seq;
    call.receiver = std::move(receiver);
    for (int64_t i = 0; i < n; ++i) {
      auto id = engine_->Submit(std::move(images[i]));
      if (!id.ok()) {  // validated above, so not expected; undo exactly anyway
        for (int64_t prev : call.ids) {
          engine_->Cancel(prev);  // its output, for an id no call holds, is ignored
          images_.erase(prev);
        }
        call_of_.erase(call.receiver.get());
        calls_.erase(seq);
        return id.status();
      }
      call.ids.push_back(*id);
      images_[*id] = {&call, i, false};
    }
    call.unfinished = n;
    call.waiting = n;
    wake_ = true;
  }
  cv_.notify_one();
  return absl::OkStatus();
}

std::vector<int64_t> GeneratorWorker::tenant_queued_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TenantQueuedCallsLocked();
}

std::vector<int64_t> GeneratorWorker::TenantQueuedCallsLocked() const {
  std::vector<int64_t> out;
  for (const auto& [seq, call] : calls_) {
    if (call.waiting == 0) continue;
    const size_t t = static_cast<size_t>(std::max<int32_t>(0, call.share.group));
    if (out.size() <= t) out.resize(t + 1, 0);
    ++out[t];
  }
  return out;
}

void GeneratorWorker::Cancel(const GenerationReceiver* receiver) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = call_of_.find(receiver);
    if (it == call_of_.end()) return;
    for (int64_t id : calls_.at(it->second).ids) engine_->Cancel(id);
    wake_ = true;
  }
  cv_.notify_one();
}

absl::Status GeneratorWorker::EnqueueScore(ScoreJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Refusal("the server is shutting down", reason::kDraining);
    // Jobs queued or being scored, until their `done`.
    if (score_jobs_.load() >= options_.max_waiting + 1)
      return Refusal(absl::StrCat("score queue is full (", score_jobs_.load(),
                                  " requests queued); retry later"),
                     reason::kQueueFull);
    score_jobs_.fetch_add(1);
    job.done = [this, done = std::move(job.done)](absl::StatusOr<std::vector<double>> r) {
      score_jobs_.fetch_sub(1);
      done(std::move(r));
    };
    scores_.push_back(std::move(job));
    wake_ = true;
  }
  cv_.notify_one();
  return absl::OkStatus();
}

void GeneratorWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
    wake_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GeneratorWorker::DropScores(std::deque<RunningScore>* scores, bool stopping) {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = scores->begin(); it != scores->end();) {
    absl::Status why;
    if (stopping) {
      why = Refusal("the server is shutting down", reason::kDraining);
    } else if (now >= it->job.deadline) {
      why = absl::DeadlineExceededError("deadline exceeded while scoring");
    } else if (it->job.cancelled && it->job.cancelled()) {
      why = absl::CancelledError("cancelled by the client");
    }
    if (why.ok()) {
      ++it;
      continue;
    }
    it->job.done(why);
    it = scores->erase(it);
  }
}

void GeneratorWorker::ScoreChunk(std::deque<RunningScore>* scores, int64_t images, bool decoding,
                                 WorkerLedger* ledger, DecodeEvent* e) {
  RunningScore& r = scores->front();
  const auto t0 = Clock::now();
  if (r.job.work) {
    const int64_t n = r.job.images.size(0);  // the whole job: one chunk
    absl::Status st;
    try {
      st = r.job.work(*model_, options_.engine.attention_impl);
    } catch (const std::exception& ex) {
      st = absl::InternalError(ExceptionMessage(ex));
    }
    e->score_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    e->score_images = n;
    ledger->OnScore(e->score_seconds, n, decoding);
    if (st.ok()) {
      r.job.done(std::vector<double>());
    } else {
      r.job.done(st);
    }
    scores->pop_front();
    return;
  }
  const std::vector<int64_t> labels =
      r.job.labels.empty() ? std::vector<int64_t>()
                           : std::vector<int64_t>(r.job.labels.begin() + r.done,
                                                  r.job.labels.begin() + r.done + images);
  auto bits = ScoreBitsPerDim(*model_, r.job.images.narrow(0, r.done, images), labels,
                              ForwardImpl(options_.engine.attention_impl), engine_->cpu_decoder());
  e->score_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  e->score_images = images;
  ledger->OnScore(e->score_seconds, images, decoding);
  if (!bits.ok()) {
    r.job.done(bits.status());
    scores->pop_front();
    return;
  }
  r.bits.insert(r.bits.end(), bits->begin(), bits->end());
  r.done += images;
  if (r.done == r.job.images.size(0)) {
    r.job.done(std::move(r.bits));
    scores->pop_front();
  }
}

void GeneratorWorker::Deliver(const StepOutput& out, Clock::time_point step_start, bool stopping,
                              WorkerLedger* ledger) {
  const Clock::time_point now = Clock::now();
  std::vector<Call*> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Ids no call holds (an image of a Submit undone part way) are passed over.
    auto owner = [this](int64_t id) -> ImageRef* {
      const auto it = images_.find(id);
      return it == images_.end() ? nullptr : &it->second;
    };
    for (int64_t id : out.admitted) {
      if (ImageRef* r = owner(id); r != nullptr) {
        r->call->update.admitted.push_back(r->image);
        r->admitted = true;
        --r->call->waiting;
      }
    }
    for (const StepOutput::Pixel& p : out.pixels) {
      if (ImageRef* r = owner(p.id); r != nullptr)
        r->call->update.pixels.push_back({r->image, p.index, p.value});
    }
    for (const StepOutput::Finished& f : out.finished) {
      if (ImageRef* r = owner(f.id); r != nullptr) {
        Call* call = r->call;
        call->update.done.push_back({r->image, f.status});
        if (f.status.ok()) ledger->OnDone(call->share, now);
        --call->unfinished;
        if (!r->admitted) --call->waiting;  // cancelled before it got a slot
        images_.erase(f.id);
      }
    }
    live.reserve(calls_.size());
    for (auto& [seq, call] : calls_) live.push_back(&call);
  }
  // Outside the lock: a receiver may call Cancel. Calls are erased only below, on this thread.
  for (Call* call : live) {
    CallUpdate& u = call->update;
    u.now = now;
    u.admitted_at = step_start;
    u.stopping = stopping;
    try {
      call->receiver->OnUpdate(u);
    } catch (const std::exception& e) {  // a receiver must not throw; if it does, its call ends
      std::fprintf(stderr, "krause-server: a generate call's update failed: %s\n",
                   ExceptionMessage(e).c_str());
      Cancel(call->receiver.get());
    }
    u.Clear();
  }
  std::vector<std::shared_ptr<GenerationReceiver>> finished;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (it->second.unfinished > 0) {
        ++it;
        continue;
      }
      call_of_.erase(it->second.receiver.get());
      finished.push_back(std::move(it->second.receiver));
      it = calls_.erase(it);
    }
  }
}

void GeneratorWorker::Loop() {
  at::NoGradGuard no_grad;
  std::deque<RunningScore> scores;  // the oldest first; the front may be part done
  WorkerLedger ledger(options_.scheduling);
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return wake_ || engine_->Busy() || !scores.empty(); });
      wake_ = false;
      stopping = stopping_;
      for (ScoreJob& j : scores_) scores.push_back(RunningScore{std::move(j), 0, {}});
      scores_.clear();
      if (stopping)
        for (const auto& [seq, call] : calls_)
          for (int64_t id : call.ids) engine_->Cancel(id);
    }
    DropScores(&scores, stopping);
    WorkerState state;
    state.decoding = engine_->active();
    state.free_slots = engine_->free_slots();
    state.waiting = engine_->Waiting();
    state.held = engine_->HeldSlots();
    if (!scores.empty()) {
      state.score_images_left = scores.front().job.images.size(0) - scores.front().done;
    }
    ledger.Fill(&state, Clock::now());
    const WorkerPlan plan = PlanWorkerIteration(state, options_.scheduling);
    const bool decoding = state.decoding > 0;

    DecodeEvent e;
    if (plan.score_images > 0) ScoreChunk(&scores, plan.score_images, decoding, &ledger, &e);
    StepOutput out;
    const auto t0 = Clock::now();
    if (plan.step) {
      out = engine_->Step(plan.admission);
      e.stats = out.stats;
      e.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      e.active = engine_->active();
      e.waiting = engine_->waiting();
      active_.store(e.active);
      slots_in_use_.store(engine_->pool().in_use());
      waiting_.store(e.waiting);
      ledger.OnStep(e.stats.prefill_tokens, e.stats.prefill_seconds, e.stats.decode_seconds,
                    decoding);
      if (on_step_) on_step_(e);
    }
    Deliver(out, t0, stopping, &ledger);
    if (stopping && !engine_->Busy() && scores.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (scores_.empty() && calls_.empty()) return;
    }
  }
}

}  // namespace krause::server
