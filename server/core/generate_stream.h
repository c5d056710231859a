// One Generate call's stream as a plain state object in native types: engine events in (an image
// admitted, a pixel, an image done), the client's events in (cancelled, a write done), and out
// what the stream does next: write a chunk (progress, finished rows, finished images, and last the
// summary), finish the call with its final status, or nothing yet. Time is passed in by the
// caller (tests drive it with a fake clock; the service passes steady_clock::now()), and nothing
// here touches gRPC, protobuf, PNG or the engine.
//
// Rules (what generate_stream_test checks case by case):
//   - one write at a time: nothing is written while a write is in flight;
//   - progress (and, with the rows output, the rows completed since the last chunk) at most once
//   per
//     `interval`, and only when pixels advanced; a finished image goes out at the next flush
//     whatever the interval, with the rows of it not sent yet;
//   - once every image is done, one last chunk carries the summary; the call finishes after it
//     has been written, or at once if an image failed or the call was cancelled;
//   - the final status: the first image error; else DEADLINE_EXCEEDED if the deadline stopped
//     it, CANCELLED if the client left or a write failed, UNAVAILABLE if the engine is stopping.
//   - the call finishes exactly once;
//   - with the final output (one answer) nothing is written until every image is done: then one
//     chunk carries every image and the summary.
// Thread-safety: none; GenerationCollector (edge/generation_collector.h) holds it under its mutex
// and carries out what it decides (cancelling engine requests, encoding PNGs, writing, finishing).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "model/attention/flops.h"
#include "server/core/generate_settings.h"
#include "server/core/model_info.h"

namespace krause::server {

class GenerateStream {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    ImageShape shape;
    int64_t images = 1;
    std::vector<uint8_t> prompt;  // the first subpixels of every image, known at the start
    uint64_t seed = 0;            // the call's: image i draws from ImageSeed(seed, first_image + i)
    uint64_t first_image = 0;
    int64_t passes = 1;  // decode passes per image (2 with guidance), for the FLOPs
    AttentionCost cost;  // per image and pass
    Clock::time_point start, deadline = Clock::time_point::max();
    Clock::duration interval = std::chrono::milliseconds(100);
    GenerateOutput output = GenerateOutput::kRows;
  };

  struct Rows {
    int64_t image = 0, first_row = 0, num_rows = 0;
    std::vector<uint8_t> pixels;  // num_rows whole rows, HWC
  };
  struct FinishedImage {
    int64_t image = 0;
    uint64_t seed = 0;
    std::vector<uint8_t> pixels;  // the whole image, HWC: the caller encodes it
  };
  struct Summary {
    int64_t images = 0, pixels_generated = 0;
    double seconds = 0, seconds_to_first_pixel = 0;
    uint64_t seed = 0;
    double flops_executed = 0, flops_dense_equivalent = 0;
  };
  struct Chunk {
    int64_t pixels_done = 0, pixels_total = 0, images_done = 0, images_total = 0;
    int64_t waiting = 0;  // images without a cache slot yet
    std::vector<Rows> rows;
    std::vector<FinishedImage> images;
    bool has_summary = false;  // the last chunk
    Summary summary;
    bool first = false;             // the call's first chunk
    uint64_t seed = 0;              // the call's seed
    uint64_t first_image = 0;       // the call's first image index
    double seconds_since_previous;  // since the previous chunk (the first: since the start)
  };
  struct Action {
    enum Kind { kNothing, kWrite, kFinish } kind = kNothing;
    Chunk chunk;          // kWrite
    absl::Status status;  // kFinish
  };

  explicit GenerateStream(Options options);

  // Engine events. Admitted returns the image's wait for its slot, in seconds.
  double Admitted(int64_t image, Clock::time_point now);
  void Pixel(int64_t image, int64_t index, uint8_t value, Clock::time_point now);
  void Done(int64_t image, absl::Status status);

  // Client events.
  void ClientCancelled() { client_cancelled_ = true; }
  void WriteDone(bool ok);

  // After each engine step: true once, when the deadline has passed with images unfinished (the
  // caller then cancels the engine requests); whether a flush is worth posting now (marks one as
  // posted until Flush runs); whether the stream still wants engine steps.
  bool DeadlinePassed(Clock::time_point now);
  bool ShouldPostFlush(Clock::time_point now);
  bool WantsSteps() const { return images_done_ < Total() && !finished_; }

  // What to do now. kWrite: the chunk is to be written; until WriteDone nothing else is written.
  // `engine_stopping` names the final status of images the engine cancelled on shutdown.
  Action Flush(Clock::time_point now, bool engine_stopping);

  // An image's PNG could not be encoded: the call ends with `status` after the current chunk.
  void EncodeFailed(int64_t image, absl::Status status);
  // A flush failed before its write started: every image not yet failed takes `status`. True
  // when the caller must finish the call with it now (it was not finished before).
  bool Fail(const absl::Status& status);

  bool finished() const { return finished_; }
  double max_queued_seconds() const { return max_queued_seconds_; }

 private:
  struct Image {
    std::vector<uint8_t> pixels;
    int64_t known = 0;  // subpixels known (prompt + sampled), a prefix
    int64_t rows_sent = 0;
    bool admitted = false;  // holds (or held) a cache slot
    bool done = false, png_sent = false;
    absl::Status status;
  };
  int64_t Total() const { return static_cast<int64_t>(images_.size()); }
  // A progress chunk is due: none sent yet, or `interval` since the last.
  bool Due(Clock::time_point now) const { return !sent_any_ || now - last_send_ >= o_.interval; }
  absl::Status FinalStatus(bool engine_stopping) const;  // all images done

  const Options o_;
  std::vector<Image> images_;
  int64_t pixels_total_ = 0, pixels_done_ = 0, images_done_ = 0;
  double max_queued_seconds_ = 0;
  double first_pixel_seconds_ = 0;
  int64_t last_sent_pixels_ = -1;
  bool deadline_hit_ = false, client_cancelled_ = false;
  bool write_in_flight_ = false, write_failed_ = false, summary_sent_ = false;
  bool finished_ = false;
  bool flush_posted_ = false;
  int64_t flushed_images_done_ = 0;  // images_done_ as the last Flush saw it
  bool sent_any_ = false;
  Clock::time_point last_send_{};
};

}  // namespace krause::server
