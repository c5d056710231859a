#include "server/generator_worker.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace krause::server {

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

bool GeneratorWorker::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

absl::StatusOr<std::vector<int64_t>> GeneratorWorker::Submit(
    std::vector<GenerationRequest> requests) {
  std::vector<int64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    const int64_t n = static_cast<int64_t>(requests.size());
    // Everything not yet holding a slot counts as waiting, including this call's images.
    const int64_t waiting = static_cast<int64_t>(live_.size()) - active_.load();
    const int64_t free_slots = slots_ - slots_in_use_.load();
    if (waiting + n - free_slots > options_.max_waiting)
      return absl::UnavailableError(
          absl::StrCat("generator queue is full (", std::max<int64_t>(waiting, 0),
                       " images waiting, ", active_.load(), " of ", slots_,
                       " slots busy, waiting limit ", options_.max_waiting, "); retry later"));
    for (GenerationRequest& r : requests) {
      // Wrap on_done so the worker knows which requests are live.
      auto done = std::move(r.on_done);
      auto id_holder = std::make_shared<int64_t>(0);
      r.on_done = [this, done = std::move(done), id_holder](absl::Status st,
                                                            std::vector<uint8_t> px) {
        {
          std::lock_guard<std::mutex> l(mu_);
          live_.erase(*id_holder);
        }
        done(std::move(st), std::move(px));
      };
      auto id = engine_->Submit(std::move(r));
      if (!id.ok()) {
        // Validation is the same for every image of a call, so this is the first one; but be
        // exact anyway: cancel what was already submitted.
        for (int64_t prev : ids) engine_->Cancel(prev);
        return id.status();
      }
      *id_holder = *id;
      live_.insert(*id);
      ids.push_back(*id);
    }
    wake_ = true;
  }
  cv_.notify_one();
  return ids;
}

void GeneratorWorker::Cancel(int64_t id) {
  engine_->Cancel(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_one();
}

absl::Status GeneratorWorker::EnqueueScore(ScoreJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    // Jobs queued or being scored, until their `done`.
    if (score_jobs_.load() >= options_.max_waiting + 1)
      return absl::UnavailableError(absl::StrCat("score queue is full (", score_jobs_.load(),
                                                 " requests queued); retry later"));
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

void GeneratorWorker::AddListener(std::shared_ptr<StepListener> listener) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    new_listeners_.push_back(std::move(listener));
    wake_ = true;
  }
  cv_.notify_one();
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
      why = absl::UnavailableError("the server is shutting down");
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

void GeneratorWorker::Loop() {
  at::NoGradGuard no_grad;
  using Clock = std::chrono::steady_clock;
  std::vector<std::shared_ptr<StepListener>> listeners;
  std::deque<RunningScore> scores;  // the oldest first; the front may be part done
  SideWorkCredit credit(options_.scheduling);
  double seconds_per_token = 0, seconds_per_image = 0;  // measured, smoothed
  auto smooth = [](double old, double now) { return old == 0 ? now : 0.7 * old + 0.3 * now; };
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return wake_ || engine_->Busy() || !scores.empty(); });
      wake_ = false;
      stopping = stopping_;
      for (ScoreJob& j : scores_) scores.push_back(RunningScore{std::move(j), 0, {}});
      scores_.clear();
      for (auto& l : new_listeners_) listeners.push_back(std::move(l));
      new_listeners_.clear();
      if (stopping)
        for (int64_t id : live_) engine_->Cancel(id);
    }
    DropScores(&scores, stopping);
    WorkerState state;
    state.decoding = engine_->active();
    state.free_slots = engine_->free_slots();
    state.waiting_prefill_tokens = engine_->WaitingPrefillTokens(state.free_slots);
    if (!scores.empty()) {
      state.score_images_left = scores.front().job.images.size(0) - scores.front().done;
    }
    state.credit_seconds = credit.seconds();
    state.seconds_per_prefill_token = seconds_per_token;
    state.seconds_per_score_image = seconds_per_image;
    const WorkerPlan plan = PlanWorkerIteration(state, options_.scheduling);

    DecodeEvent e;
    if (plan.score_images > 0) {
      RunningScore& r = scores.front();
      const auto t0 = Clock::now();
      const std::vector<int64_t> labels =
          r.job.labels.empty()
              ? std::vector<int64_t>()
              : std::vector<int64_t>(r.job.labels.begin() + r.done,
                                     r.job.labels.begin() + r.done + plan.score_images);
      auto bits =
          ScoreBitsPerDim(*model_, r.job.images.narrow(0, r.done, plan.score_images), labels);
      e.score_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      e.score_images = plan.score_images;
      seconds_per_image = smooth(seconds_per_image, e.score_seconds / plan.score_images);
      if (state.decoding > 0) credit.OnSideWork(e.score_seconds);
      if (!bits.ok()) {
        r.job.done(bits.status());
        scores.pop_front();
      } else {
        r.bits.insert(r.bits.end(), bits->begin(), bits->end());
        r.done += plan.score_images;
        if (r.done == r.job.images.size(0)) {
          r.job.done(std::move(r.bits));
          scores.pop_front();
        }
      }
    }
    if (plan.step) {
      const auto t0 = Clock::now();
      e.stats = engine_->Step(plan.admit);
      e.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      e.active = engine_->active();
      e.waiting = engine_->waiting();
      active_.store(e.active);
      slots_in_use_.store(engine_->pool().in_use());
      waiting_.store(e.waiting);
      credit.OnDecode(e.stats.decode_seconds);
      if (e.stats.prefill_tokens > 0) {
        if (state.decoding > 0) credit.OnSideWork(e.stats.prefill_seconds);
        seconds_per_token =
            smooth(seconds_per_token, e.stats.prefill_seconds / e.stats.prefill_tokens);
      }
      if (on_step_) on_step_(e);
    }
    for (auto it = listeners.begin(); it != listeners.end();) {
      if ((*it)->AfterStep()) {
        ++it;
      } else {
        it = listeners.erase(it);
      }
    }
    if (stopping && !engine_->Busy() && scores.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (scores_.empty() && new_listeners_.empty()) return;
    }
  }
}

}  // namespace krause::server
