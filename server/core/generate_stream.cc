#include "server/core/generate_stream.h"

#include <algorithm>
#include <utility>

#include "server/core/errors.h"
#include "server/core/operations.h"

namespace krause::server {
namespace {

double Seconds(GenerateStream::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

GenerateStream::GenerateStream(Options options) : o_(std::move(options)) {
  const int64_t len = o_.shape.height * o_.shape.width * o_.shape.channels;
  const int64_t known = std::min<int64_t>(static_cast<int64_t>(o_.prompt.size()), len);
  images_.resize(o_.images);
  for (Image& im : images_) {
    im.pixels.assign(len, 0);
    std::copy(o_.prompt.begin(), o_.prompt.begin() + known, im.pixels.begin());
    im.known = known;
  }
  pixels_total_ = o_.images * (len - known);
}

double GenerateStream::Admitted(int64_t image, Clock::time_point now) {
  const double waited = Seconds(now - o_.start);
  images_[image].admitted = true;
  max_queued_seconds_ = std::max(max_queued_seconds_, waited);
  return waited;
}

void GenerateStream::Pixel(int64_t image, int64_t index, uint8_t value, Clock::time_point now) {
  Image& im = images_[image];
  im.pixels[index] = value;
  im.known = index + 1;
  if (pixels_done_ == 0) first_pixel_seconds_ = Seconds(now - o_.start);
  ++pixels_done_;
}

void GenerateStream::Done(int64_t image, absl::Status status) {
  Image& im = images_[image];
  if (im.done) return;
  im.done = true;
  im.status = std::move(status);
  ++images_done_;
}

void GenerateStream::WriteDone(bool ok) {
  write_in_flight_ = false;
  if (!ok) write_failed_ = true;
}

bool GenerateStream::DeadlinePassed(Clock::time_point now) {
  if (deadline_hit_ || now < o_.deadline || images_done_ >= Total()) return false;
  deadline_hit_ = true;
  return true;
}

bool GenerateStream::ShouldPostFlush(Clock::time_point now) {
  if (finished_ || write_in_flight_ || flush_posted_) return false;
  if (o_.output == GenerateOutput::kFinal && images_done_ < Total()) return false;
  if (!Due(now) && images_done_ == flushed_images_done_) return false;
  flush_posted_ = true;
  return true;
}

absl::Status GenerateStream::FinalStatus(bool engine_stopping) const {
  absl::Status error, cancelled;
  for (const Image& im : images_) {
    if (im.status.ok()) continue;
    if (absl::IsCancelled(im.status)) {
      cancelled = im.status;
    } else if (error.ok()) {
      error = im.status;
    }
  }
  if (!error.ok()) return error;
  if (cancelled.ok() && !write_failed_) return absl::OkStatus();
  if (deadline_hit_) return absl::DeadlineExceededError("deadline exceeded; generation stopped");
  if (client_cancelled_ || write_failed_) return absl::CancelledError("cancelled by the client");
  if (engine_stopping)
    return Refusal("the server is shutting down; generation was cancelled", reason::kDraining);
  return cancelled.ok() ? absl::CancelledError("cancelled") : cancelled;
}

GenerateStream::Action GenerateStream::Flush(Clock::time_point now, bool engine_stopping) {
  Action a;
  flush_posted_ = false;
  flushed_images_done_ = images_done_;
  if (finished_ || write_in_flight_) return a;
  const bool all_done = images_done_ == Total();
  if (o_.output == GenerateOutput::kFinal && !all_done) return a;  // one answer, at the end
  if (all_done) {
    const absl::Status st = FinalStatus(engine_stopping);
    if (!st.ok() || summary_sent_) {
      finished_ = true;
      a.kind = Action::kFinish;
      a.status = st;
      return a;
    }
  }
  const bool due = Due(now);
  Chunk& c = a.chunk;
  c.pixels_done = pixels_done_;
  c.pixels_total = pixels_total_;
  c.images_done = images_done_;
  c.images_total = Total();
  int64_t started = 0;
  // (Not `known > 0`: a completion's prompt is known before the image has a slot.)
  for (const Image& im : images_) started += (im.admitted || im.done) ? 1 : 0;
  c.waiting = Total() - started;
  const int64_t row_len = o_.shape.width * o_.shape.channels;
  bool news = false;
  for (int64_t i = 0; i < Total(); ++i) {
    Image& im = images_[i];
    // A finished image's last rows go out with it, whatever the interval: a client holding an
    // image's PNG holds all of its rows (what a resume after a break relies on).
    const bool finishing = im.done && im.status.ok() && !im.png_sent;
    if (o_.output == GenerateOutput::kRows && (due || all_done || finishing)) {
      const int64_t rows = im.known / row_len;
      if (rows > im.rows_sent) {
        Rows r;
        r.image = i;
        r.first_row = im.rows_sent;
        r.num_rows = rows - im.rows_sent;
        r.pixels.assign(im.pixels.begin() + im.rows_sent * row_len,
                        im.pixels.begin() + rows * row_len);
        c.rows.push_back(std::move(r));
        im.rows_sent = rows;
        news = true;
      }
    }
    if (im.done && im.status.ok() && !im.png_sent) {
      c.images.push_back(
          {i, ImageSeed(o_.seed, o_.first_image + static_cast<uint64_t>(i)), im.pixels});
      im.png_sent = true;
      news = true;
    }
  }
  if (all_done) {
    c.has_summary = true;
    Summary& s = c.summary;
    s.images = Total();
    s.pixels_generated = pixels_done_;
    s.seconds = Seconds(now - o_.start);
    s.seconds_to_first_pixel = first_pixel_seconds_;
    s.seed = o_.seed;
    const double runs = static_cast<double>(Total() * o_.passes);
    s.flops_executed = o_.cost.executed_flops * runs;
    s.flops_dense_equivalent = o_.cost.dense_equivalent_flops * runs;
    summary_sent_ = true;
  } else if (sent_any_ && !news && !(due && pixels_done_ != last_sent_pixels_)) {
    return a;  // nothing worth a message (the first always is: the call's start)
  }
  a.kind = Action::kWrite;
  write_in_flight_ = true;
  c.first = !sent_any_;
  c.seed = o_.seed;
  c.first_image = o_.first_image;
  c.seconds_since_previous = Seconds(now - (sent_any_ ? last_send_ : o_.start));
  sent_any_ = true;
  last_send_ = now;
  last_sent_pixels_ = pixels_done_;
  return a;
}

void GenerateStream::EncodeFailed(int64_t image, absl::Status status) {
  images_[image].status = std::move(status);
}

bool GenerateStream::Fail(const absl::Status& status) {
  write_in_flight_ = false;
  for (Image& im : images_)
    if (im.status.ok()) im.status = status;
  if (finished_) return false;
  finished_ = true;
  return true;
}

}  // namespace krause::server
