#include "client/resume.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/edge/status.h"

namespace krause::client {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// A break the next attempt may cure: the replica went away, was draining or full (UNAVAILABLE),
// cancelled the call (CANCELLED that this client did not ask for: a server stopping cancels what
// reaches it during its shutdown), or this attempt ran past its own timeout.
bool Retryable(const grpc::Status& st, bool timed_out) {
  return RetryableCode(st.error_code()) ||
         (timed_out && st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
}

}  // namespace

ResumeState::ResumeState(v1::GenerateRequest request, const ResumeOptions& options,
                         uint64_t random_seed, Clock::time_point now)
    : request_([&] {
        if (!request.has_seed()) request.set_seed(random_seed);
        return request;
      }()),
      options_(options),
      want_rows_(!request_.has_stream_rows() || request_.stream_rows()),
      start_(now) {
  if (options_.deadline_seconds > 0)
    deadline_ = now + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(options_.deadline_seconds));
  original_prompt_rows_ = request_.has_prompt() ? request_.prompt_rows() : 0;
  images_.resize(std::max<uint32_t>(1, request_.num_images()));
}

ResumeState::Attempt ResumeState::First() {
  std::vector<int64_t> all(images_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  return Make(std::move(all), start_);
}

ResumeState::Attempt ResumeState::Make(std::vector<int64_t> images, Clock::time_point not_before) {
  Attempt a;
  a.id = next_id_++;
  a.not_before = not_before;
  a.request = request_;
  a.request.set_stream_rows(true);  // the rows are what a resume continues from
  if (!version_.empty()) {          // every attempt runs the first one's weights
    a.request.set_model(model_);
    a.request.set_version(version_);
  }
  Live live;
  live.prompt_rows = original_prompt_rows_;
  const int64_t first = images.front();
  // The call's seed, and the run's first index: the images' own random streams.
  a.request.set_first_image(request_.first_image() + static_cast<uint32_t>(first));
  a.request.set_num_images(static_cast<uint32_t>(images.size()));
  const int64_t rows = images_[first].rows;
  if (images.size() == 1 && rows > original_prompt_rows_) {
    // A completion from the rows received (all but the last row if every row came and the
    // image did not: a prompt is shorter than the image).
    const int64_t keep = std::min<int64_t>(rows, height_ - 1);
    v1::RawImage* raw = a.request.mutable_prompt()->mutable_raw();
    raw->set_height(static_cast<uint32_t>(keep));
    raw->set_width(width_);
    raw->set_channels(channels_);
    raw->set_pixels(images_[first].pixels.substr(0, keep * RowLength()));
    a.request.set_prompt_rows(static_cast<uint32_t>(keep));
    live.prompt_rows = keep;
  }
  for (int64_t i : images) images_[i].attempt = a.id;
  live.images = images;
  a.images = std::move(images);
  live_[a.id] = std::move(live);
  ++stats_.attempts;
  return a;
}

std::optional<ResumeState::Clock::time_point> ResumeState::AttemptDeadline(
    Clock::time_point now) const {
  std::optional<Clock::time_point> d = deadline_;
  if (options_.attempt_timeout_seconds > 0) {
    const Clock::time_point a =
        now + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(options_.attempt_timeout_seconds));
    if (!d || a < *d) d = a;
  }
  return d;
}

v1::GenerateResponse ResumeState::Progress() const {
  v1::GenerateResponse m;
  v1::GenerateProgress* p = m.mutable_progress();
  const int64_t len = int64_t{height_} * RowLength();
  const int64_t prompt = original_prompt_rows_ * RowLength();
  uint64_t done = 0;
  uint32_t finished = 0, waiting = 0;
  for (const Image& im : images_) {
    const int64_t known = im.finished ? len : im.rows * RowLength();
    done += static_cast<uint64_t>(std::max<int64_t>(0, known - prompt));
    finished += im.finished ? 1 : 0;
  }
  for (const auto& [id, live] : live_) waiting += live.waiting;
  p->set_pixels_done(done);
  p->set_pixels_total(static_cast<uint64_t>(static_cast<int64_t>(images_.size()) * (len - prompt)));
  p->set_images_done(finished);
  p->set_images_total(static_cast<uint32_t>(images_.size()));
  p->set_waiting(waiting);
  return m;
}

std::optional<v1::GenerateResponse> ResumeState::OnMessage(int id, const v1::GenerateResponse& m,
                                                           Clock::time_point now) {
  auto it = live_.find(id);
  if (it == live_.end() || done_) return std::nullopt;
  Live& live = it->second;
  bool send_start = false;
  if (m.has_start() && started_ && m.start().numerics() != numerics_) {
    // A replica that computes otherwise (another precision, implementation, kernel family or
    // dtype) would continue the images with other bits: the call fails rather than splice them.
    done_ = true;
    status_ =
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     absl::StrCat("not resumed: the resumed attempt's replica computes with \"",
                                  m.start().numerics(), "\", the stream began with \"", numerics_,
                                  "\" (its rows would not continue these images bit for bit)"));
    return std::nullopt;
  }
  if (m.has_start() && !started_) {
    const v1::GenerateStart& s = m.start();
    model_ = s.model();
    version_ = s.model_version();
    numerics_ = s.numerics();
    height_ = s.height();
    width_ = s.width();
    channels_ = s.channels();
    started_ = true;
    send_start = true;
  }
  live.first_seen = true;
  live.pixels_done = m.progress().pixels_done();
  live.waiting = m.progress().waiting();
  if (m.has_summary()) {
    flops_executed_ += m.summary().flops_executed();
    flops_dense_ += m.summary().flops_dense_equivalent();
  }
  v1::GenerateResponse out = Progress();
  if (send_start) *out.mutable_start() = m.start();
  if (!started_) return out;  // a server without GenerateStart: progress only, not resumable
  const int64_t row_len = RowLength();
  bool progressed = false;
  for (const v1::ImageRows& r : m.rows()) {
    if (r.image() >= live.images.size()) continue;
    const int64_t i = live.images[r.image()];
    Image& im = images_[i];
    v1::ImageRows* delivered = nullptr;
    for (uint32_t k = 0; k < r.num_rows(); ++k) {
      const int64_t row = int64_t{r.first_row()} + k;
      if (row != im.rows || row >= height_) continue;  // an echo of a prompt row (or no gap)
      const size_t at = static_cast<size_t>(k * row_len);
      if (r.pixels().size() < at + row_len) break;
      im.pixels.append(r.pixels(), at, static_cast<size_t>(row_len));
      ++im.rows;
      progressed = true;
      if (row >= live.prompt_rows) ++live.sampled_rows[i];
      if (!want_rows_) continue;
      if (delivered == nullptr) {
        delivered = out.add_rows();
        delivered->set_image(static_cast<uint32_t>(i));
        delivered->set_first_row(static_cast<uint32_t>(row));
      }
      delivered->set_num_rows(delivered->num_rows() + 1);
      delivered->mutable_pixels()->append(r.pixels(), at, static_cast<size_t>(row_len));
    }
  }
  for (const v1::GeneratedImage& g : m.images()) {
    if (g.image() >= live.images.size()) continue;
    const int64_t i = live.images[g.image()];
    if (images_[i].finished) continue;
    images_[i].finished = true;
    progressed = true;
    v1::GeneratedImage* o = out.add_images();
    *o = g;
    o->set_image(static_cast<uint32_t>(i));
  }
  if (progressed) failures_ = 0;
  if (first_pixel_seconds_ < 0 && m.progress().pixels_done() > 0)
    first_pixel_seconds_ = Seconds(now - start_);
  *out.mutable_progress() = Progress().progress();
  return out;
}

std::vector<ResumeState::Attempt> ResumeState::OnEnd(int id, const grpc::Status& status,
                                                     const std::string& peer, bool timed_out,
                                                     Clock::time_point now) {
  std::vector<Attempt> next;
  auto it = live_.find(id);
  if (it == live_.end() || done_) return next;
  const Live live = std::move(it->second);
  live_.erase(it);
  std::vector<int64_t> unfinished;
  for (int64_t i : live.images)
    if (!images_[i].finished) unfinished.push_back(i);
  grpc::Status st = status;
  if (st.ok() && !unfinished.empty())
    st = grpc::Status(grpc::StatusCode::INTERNAL, "the stream ended with images unfinished");
  if (!st.ok()) {
    // Resumable: the server said what it resolved (GenerateStart), or nothing of these images
    // came yet (asking them again from the start is the same call).
    bool resumable = started_;
    for (int64_t i : unfinished) resumable = resumable || images_[i].rows <= original_prompt_rows_;
    const bool in_time = !deadline_ || now < *deadline_;
    if (!options_.resume || !resumable || !Retryable(st, timed_out) || !in_time ||
        static_cast<int64_t>(stats_.breaks.size()) >= options_.max_resumes) {
      done_ = true;
      status_ = st;
      return next;
    }
    stats_.breaks.push_back(
        absl::StrCat(peer, ": ", server::GrpcCodeName(st.error_code()), ": ", st.error_message()));
    // Work lost: what the attempt had sampled (its last progress) but not delivered.
    if (started_) {
      const int64_t row_len = RowLength();
      const int64_t len = int64_t{height_} * row_len;
      int64_t delivered = 0;
      for (int64_t i : live.images) {
        if (images_[i].finished) {
          delivered += len - live.prompt_rows * row_len;
        } else if (auto s = live.sampled_rows.find(i); s != live.sampled_rows.end()) {
          delivered += s->second * row_len;
        }
      }
      const int64_t lost = static_cast<int64_t>(live.pixels_done) - delivered;
      if (lost > 0) stats_.rows_recomputed += (lost + row_len - 1) / row_len;
    }
    // When to try again: the server's RetryInfo (DRAINING: at once; QUEUE_FULL: its delay), else
    // a backoff that doubles with each break in a row.
    ++failures_;
    std::chrono::milliseconds delay = options_.backoff;
    for (int f = 1; f < failures_ && delay < options_.max_backoff; ++f) delay *= 2;
    delay = std::min(delay, options_.max_backoff);
    const server::ErrorDetails d = server::DetailsOf(st);
    if (d.retry_delay) delay = *d.retry_delay;
    const Clock::time_point at = now + delay;
    // Images with rows beyond the call's own prompt continue one per call from their rows;
    // runs of consecutive images with none are asked together (the seed, first_image).
    std::vector<int64_t> run;
    auto flush_run = [&] {
      if (run.empty()) return;
      next.push_back(Make(std::move(run), at));
      run.clear();
    };
    for (int64_t i : unfinished) {
      if (images_[i].rows > original_prompt_rows_) {
        flush_run();
        stats_.rows_kept += std::min<int64_t>(images_[i].rows, height_ - 1) - original_prompt_rows_;
        next.push_back(Make({i}, at));
      } else {
        if (!run.empty() && run.back() != i - 1) flush_run();
        run.push_back(i);
      }
    }
    flush_run();
    stats_.resumed_calls += static_cast<int64_t>(next.size());
    stats_.images_resumed += static_cast<int64_t>(unfinished.size());
    // A resumed attempt counts once in attempts (Make) and once in resumed_calls.
  }
  bool all = live_.empty();
  for (const Image& im : images_) all = all && im.finished;
  if (all) done_ = true;  // status_ stays OK
  return next;
}

v1::GenerateResponse ResumeState::Last(Clock::time_point now) const {
  v1::GenerateResponse m = Progress();
  v1::GenerateSummary* s = m.mutable_summary();
  s->set_model(model_);
  s->set_model_version(version_);
  s->set_images(static_cast<uint32_t>(images_.size()));
  s->set_pixels_generated(m.progress().pixels_total());
  s->set_seconds(Seconds(now - start_));
  s->set_seconds_to_first_pixel(std::max(0.0, first_pixel_seconds_));
  s->set_seed(request_.seed());
  s->set_flops_executed(flops_executed_);
  s->set_flops_dense_equivalent(flops_dense_);
  return m;
}

// --- ResumingGenerate ---------------------------------------------------------------------------

class ResumingGenerate::AttemptCall final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  AttemptCall(ResumingGenerate* owner, ResumeState::Attempt a,
              std::optional<ResumeState::Clock::time_point> deadline)
      : owner_(owner), id_(a.id), request_(std::move(a.request)), deadline_(deadline) {
    ConnectionOptions conn = owner->conn_;
    conn.timeout_seconds = 0;  // the deadlines are the state's
    PrepareContext(conn, &ctx_);
    if (deadline_) {
      ctx_.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(
                            *deadline_ - ResumeState::Clock::now()));
    }
    owner->stub_->async()->Generate(&ctx_, &request_, this);
  }
  void Go() {
    { std::lock_guard<std::mutex> published(mu_); }  // see mu_
    StartRead(&message_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    { std::lock_guard<std::mutex> published(mu_); }
    if (!ok) return;
    owner_->OnMessage(id_, message_);
    StartRead(&message_);
  }
  void OnDone(const grpc::Status& status) override {
    { std::lock_guard<std::mutex> published(mu_); }
    owner_->OnEnd(this, status);
  }
  void Cancel() { ctx_.TryCancel(); }
  int id() const { return id_; }
  std::string peer() { return ctx_.peer(); }
  bool timed_out() const { return deadline_ && ResumeState::Clock::now() >= *deadline_; }

 private:
  // Taken by Go and then by each reaction: what the constructor wrote is visibly published to
  // gRPC's threads (gRPC orders StartCall before the reactions inside its uninstrumented library,
  // which ThreadSanitizer cannot see).
  std::mutex mu_;
  ResumingGenerate* const owner_;
  const int id_;
  grpc::ClientContext ctx_;
  v1::GenerateRequest request_;
  v1::GenerateResponse message_;
  const std::optional<ResumeState::Clock::time_point> deadline_;
};

ResumingGenerate::ResumingGenerate(v1::KrauseService::Stub* stub, ConnectionOptions conn,
                                   v1::GenerateRequest request, ResumeOptions options)
    : stub_(stub),
      conn_(std::move(conn)),
      state_(std::move(request), options, std::random_device{}() * 0x100000001ull,
             ResumeState::Clock::now()) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(state_.First());
}

ResumingGenerate::~ResumingGenerate() {
  Cancel();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return running_.empty(); });
}

void ResumingGenerate::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  pending_.clear();
  for (auto& [id, call] : running_) call->Cancel();
  cv_.notify_all();
}

bool ResumingGenerate::Read(v1::GenerateResponse* out) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!out_.empty()) {
      *out = std::move(out_.front());
      out_.pop_front();
      return true;
    }
    const bool over = cancelled_ || state_.done();
    if (over) {
      pending_.clear();
      if (!running_.empty()) {
        cv_.wait(lock);
        continue;
      }
      if (!cancelled_ && state_.status().ok() && !last_sent_) {
        last_sent_ = true;
        *out = state_.Last(ResumeState::Clock::now());
        return true;
      }
      return false;
    }
    // Start the attempts that are due (outside the lock: a call may end on another thread
    // before StartCall returns).
    const auto now = ResumeState::Clock::now();
    std::vector<AttemptCall*> go;
    std::optional<ResumeState::Clock::time_point> next;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->not_before <= now) {
        auto* call = new AttemptCall(this, std::move(*it), state_.AttemptDeadline(now));
        running_[call->id()] = call;
        go.push_back(call);
        it = pending_.erase(it);
      } else {
        if (!next || it->not_before < *next) next = it->not_before;
        ++it;
      }
    }
    if (!go.empty()) {
      lock.unlock();
      for (AttemptCall* c : go) c->Go();
      lock.lock();
      continue;
    }
    if (next) {
      cv_.wait_until(lock, *next);
    } else {
      cv_.wait(lock);
    }
  }
}

grpc::Status ResumingGenerate::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.done()) return state_.status();
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller");
}

ResumeStats ResumingGenerate::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.stats();
}

void ResumingGenerate::OnMessage(int id, const v1::GenerateResponse& m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return;
  auto out = state_.OnMessage(id, m, ResumeState::Clock::now());
  if (state_.done() && !state_.status().ok()) {
    for (auto& [other, c] : running_) c->Cancel();
    cv_.notify_all();
  }
  if (!out) return;
  out_.push_back(std::move(*out));
  cv_.notify_all();
}

void ResumingGenerate::OnEnd(AttemptCall* call, const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_.erase(call->id());
    if (!cancelled_) {
      auto next = state_.OnEnd(call->id(), status, call->peer(), call->timed_out(),
                               ResumeState::Clock::now());
      for (auto& a : next) pending_.push_back(std::move(a));
      if (state_.done() && !state_.status().ok())
        for (auto& [id, c] : running_) c->Cancel();
    }
    cv_.notify_all();
  }
  delete call;
}

}  // namespace krause::client
