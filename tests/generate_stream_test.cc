// GenerateStream (server/core/generate_stream.h), the Generate call's state, driven with a fake
// clock: exact chunks (progress, rows, finished images, summary), the write-one-at-a-time rule, the
// interval, and the final status of every ending (done, deadline, client gone, write failed,
// engine stopping, an image error, a PNG that failed, a flush that threw). No server, no sleeps.
#include "server/core/generate_stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "server/core/operations.h"

namespace krause::server {
namespace {

using Clock = GenerateStream::Clock;
using Action = GenerateStream::Action;
using std::chrono::milliseconds;

const Clock::time_point t0 = Clock::time_point{} + std::chrono::seconds(7);
Clock::time_point At(int ms) { return t0 + milliseconds(ms); }

// Two 2x3 gray images (rows of 3 subpixels), a 100 ms interval.
GenerateStream::Options TwoImages() {
  GenerateStream::Options o;
  o.shape = {2, 3, 1};
  o.images = 2;
  o.seed = 40;
  o.passes = 2;
  o.cost.executed_flops = 10;
  o.cost.dense_equivalent_flops = 25;
  o.start = t0;
  o.interval = milliseconds(100);
  return o;
}

void Sample(GenerateStream* s, int64_t image, int64_t from, int64_t to, int ms) {
  for (int64_t i = from; i < to; ++i)
    s->Pixel(image, i, static_cast<uint8_t>(10 * image + i), At(ms));
}

std::vector<uint8_t> Px(std::initializer_list<int> v) { return {v.begin(), v.end()}; }

TEST(GenerateStreamTest, ChunksFollowTheIntervalAndTheLastCarriesTheSummary) {
  GenerateStream s(TwoImages());
  // The first flush is due at once: progress only.
  Action a = s.Flush(At(0), false);
  ASSERT_EQ(a.kind, Action::kWrite);
  EXPECT_TRUE(a.chunk.first);
  EXPECT_EQ(a.chunk.pixels_done, 0);
  EXPECT_EQ(a.chunk.pixels_total, 12);
  EXPECT_EQ(a.chunk.images_total, 2);
  EXPECT_EQ(a.chunk.waiting, 2);
  EXPECT_TRUE(a.chunk.rows.empty());
  EXPECT_DOUBLE_EQ(a.chunk.seconds_since_previous, 0);
  // One write at a time.
  EXPECT_EQ(s.Flush(At(1), false).kind, Action::kNothing);
  EXPECT_FALSE(s.ShouldPostFlush(At(500)));
  s.WriteDone(true);

  EXPECT_DOUBLE_EQ(s.Admitted(0, At(5)), 0.005);
  Sample(&s, 0, 0, 3, 10);                                   // image 0's first row
  EXPECT_EQ(s.Flush(At(50), false).kind, Action::kNothing);  // not due, nothing finished
  EXPECT_FALSE(s.ShouldPostFlush(At(50)));
  EXPECT_TRUE(s.ShouldPostFlush(At(100)));
  EXPECT_FALSE(s.ShouldPostFlush(At(100)));  // one posted flush at a time
  a = s.Flush(At(100), false);
  ASSERT_EQ(a.kind, Action::kWrite);
  EXPECT_FALSE(a.chunk.first);
  EXPECT_DOUBLE_EQ(a.chunk.seconds_since_previous, 0.1);
  EXPECT_EQ(a.chunk.pixels_done, 3);
  EXPECT_EQ(a.chunk.waiting, 1);
  ASSERT_EQ(a.chunk.rows.size(), 1u);
  EXPECT_EQ(a.chunk.rows[0].image, 0);
  EXPECT_EQ(a.chunk.rows[0].first_row, 0);
  EXPECT_EQ(a.chunk.rows[0].num_rows, 1);
  EXPECT_EQ(a.chunk.rows[0].pixels, Px({0, 1, 2}));
  EXPECT_TRUE(a.chunk.images.empty());
  s.WriteDone(true);

  // A finished image goes out at the next flush, before the interval, with its rows not sent
  // yet (a client holding the PNG holds every row: what a resume relies on).
  Sample(&s, 0, 3, 6, 110);
  s.Done(0, absl::OkStatus());
  EXPECT_TRUE(s.ShouldPostFlush(At(120)));
  a = s.Flush(At(120), false);
  ASSERT_EQ(a.kind, Action::kWrite);
  ASSERT_EQ(a.chunk.rows.size(), 1u);
  EXPECT_EQ(a.chunk.rows[0].image, 0);
  EXPECT_EQ(a.chunk.rows[0].first_row, 1);
  EXPECT_EQ(a.chunk.rows[0].pixels, Px({3, 4, 5}));
  ASSERT_EQ(a.chunk.images.size(), 1u);
  EXPECT_EQ(a.chunk.images[0].image, 0);
  EXPECT_EQ(a.chunk.images[0].seed, 40u);
  EXPECT_EQ(a.chunk.images[0].pixels, Px({0, 1, 2, 3, 4, 5}));
  EXPECT_FALSE(a.chunk.has_summary);
  s.WriteDone(true);
  EXPECT_TRUE(s.WantsSteps());

  s.Admitted(1, At(121));
  Sample(&s, 1, 0, 6, 125);
  s.Done(1, absl::OkStatus());
  EXPECT_FALSE(s.WantsSteps());
  a = s.Flush(At(130), false);
  ASSERT_EQ(a.kind, Action::kWrite);
  // All done: every remaining row, the last image and the summary.
  ASSERT_EQ(a.chunk.rows.size(), 1u);
  EXPECT_EQ(a.chunk.rows[0].image, 1);
  EXPECT_EQ(a.chunk.rows[0].num_rows, 2);
  EXPECT_EQ(a.chunk.rows[0].pixels, Px({10, 11, 12, 13, 14, 15}));
  ASSERT_EQ(a.chunk.images.size(), 1u);
  EXPECT_EQ(a.chunk.images[0].seed, ImageSeed(40, 1));  // image 1's own stream
  ASSERT_TRUE(a.chunk.has_summary);
  EXPECT_EQ(a.chunk.summary.images, 2);
  EXPECT_EQ(a.chunk.summary.pixels_generated, 12);
  EXPECT_DOUBLE_EQ(a.chunk.summary.seconds, 0.13);
  EXPECT_DOUBLE_EQ(a.chunk.summary.seconds_to_first_pixel, 0.01);
  EXPECT_EQ(a.chunk.summary.seed, 40u);
  EXPECT_DOUBLE_EQ(a.chunk.summary.flops_executed, 10.0 * 2 * 2);  // images x passes
  EXPECT_DOUBLE_EQ(a.chunk.summary.flops_dense_equivalent, 25.0 * 2 * 2);
  EXPECT_EQ(a.chunk.images_done, 2);
  EXPECT_EQ(a.chunk.waiting, 0);
  EXPECT_DOUBLE_EQ(s.max_queued_seconds(), 0.121);
  // Finishes only after the summary's write, exactly once.
  EXPECT_EQ(s.Flush(At(131), false).kind, Action::kNothing);
  s.WriteDone(true);
  a = s.Flush(At(140), false);
  ASSERT_EQ(a.kind, Action::kFinish);
  EXPECT_TRUE(a.status.ok()) << a.status;
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.Flush(At(150), false).kind, Action::kNothing);
  EXPECT_FALSE(s.ShouldPostFlush(At(1000)));
}

TEST(GenerateStreamTest, NoProgressChunkWhenNothingAdvanced) {
  GenerateStream s(TwoImages());
  ASSERT_EQ(s.Flush(At(0), false).kind, Action::kWrite);
  s.WriteDone(true);
  EXPECT_EQ(s.Flush(At(200), false).kind, Action::kNothing);  // due, but no pixel since
  s.Pixel(0, 0, 9, At(210));
  EXPECT_EQ(s.Flush(At(220), false).kind, Action::kWrite);  // a pixel, not yet a row
}

TEST(GenerateStreamTest, WithoutStreamRowsOnlyProgressImagesAndSummary) {
  GenerateStream::Options o = TwoImages();
  o.output = GenerateOutput::kProgress;
  o.prompt = {7, 8, 9};  // one known row
  GenerateStream s(o);
  Action a = s.Flush(At(0), false);
  ASSERT_EQ(a.kind, Action::kWrite);
  EXPECT_EQ(a.chunk.pixels_total, 6);
  EXPECT_EQ(a.chunk.waiting, 2);  // the prompt is known, but no image has a slot
  EXPECT_TRUE(a.chunk.rows.empty());
  s.WriteDone(true);
  for (int64_t i : {0, 1}) {
    s.Admitted(i, At(1));
    Sample(&s, i, 3, 6, 2);
    s.Done(i, absl::OkStatus());
  }
  a = s.Flush(At(300), false);
  ASSERT_EQ(a.kind, Action::kWrite);
  EXPECT_TRUE(a.chunk.rows.empty());
  ASSERT_EQ(a.chunk.images.size(), 2u);
  EXPECT_EQ(a.chunk.images[1].pixels, Px({7, 8, 9, 13, 14, 15}));
  EXPECT_TRUE(a.chunk.has_summary);
  EXPECT_EQ(a.chunk.summary.pixels_generated, 6);
}

TEST(GenerateStreamTest, TheFinalOutputWritesOneChunkWithEverythingAtTheEnd) {
  GenerateStream::Options o = TwoImages();
  o.output = GenerateOutput::kFinal;
  GenerateStream s(o);
  EXPECT_FALSE(s.ShouldPostFlush(At(0)));  // nothing yet: not even the start
  EXPECT_EQ(s.Flush(At(0), false).kind, Action::kNothing);
  s.Admitted(0, At(1));
  Sample(&s, 0, 0, 6, 2);
  s.Done(0, absl::OkStatus());
  EXPECT_FALSE(s.ShouldPostFlush(At(500)));  // an image done, the other not: still nothing
  EXPECT_EQ(s.Flush(At(500), false).kind, Action::kNothing);
  s.Admitted(1, At(2));
  Sample(&s, 1, 0, 6, 2);
  s.Done(1, absl::OkStatus());
  EXPECT_TRUE(s.ShouldPostFlush(At(510)));
  Action a = s.Flush(At(510), false);
  ASSERT_EQ(a.kind, Action::kWrite);
  EXPECT_TRUE(a.chunk.first);  // the one chunk is also the first
  EXPECT_TRUE(a.chunk.rows.empty());
  ASSERT_EQ(a.chunk.images.size(), 2u);
  EXPECT_TRUE(a.chunk.has_summary);
  EXPECT_EQ(a.chunk.summary.images, 2);
  s.WriteDone(true);
  a = s.Flush(At(520), false);
  ASSERT_EQ(a.kind, Action::kFinish);
  EXPECT_TRUE(a.status.ok()) << a.status;
  // A failed image: no chunk at all, the call ends with its error.
  GenerateStream f(o);
  f.Done(0, absl::InternalError("boom"));
  f.Done(1, absl::OkStatus());
  ASSERT_TRUE(f.ShouldPostFlush(At(5)));
  a = f.Flush(At(5), false);
  ASSERT_EQ(a.kind, Action::kFinish);
  EXPECT_EQ(a.status.code(), absl::StatusCode::kInternal);
}

// Runs a stream whose images end with `statuses` (after `setup`) and returns its final status.
template <typename F>
absl::Status Ending(std::vector<absl::Status> statuses, bool engine_stopping, F setup) {
  GenerateStream::Options o = TwoImages();
  o.deadline = At(1000);
  GenerateStream s(o);
  setup(&s);
  for (int64_t i = 0; i < 2; ++i) s.Done(i, statuses[i]);
  Action a = s.Flush(At(2000), engine_stopping);
  EXPECT_EQ(a.kind, Action::kFinish);  // no summary for a call that failed
  EXPECT_TRUE(s.finished());
  return a.status;
}

TEST(GenerateStreamTest, TheFinalStatusOfEachEnding) {
  const absl::Status cancelled = absl::CancelledError("cancelled");
  auto nothing = [](GenerateStream*) {};
  // The deadline: reported once, while images are unfinished.
  absl::Status st = Ending({cancelled, cancelled}, false, [](GenerateStream* s) {
    EXPECT_FALSE(s->DeadlinePassed(At(999)));
    EXPECT_TRUE(s->DeadlinePassed(At(1000)));
    EXPECT_FALSE(s->DeadlinePassed(At(1001)));
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  st = Ending({cancelled, cancelled}, false, [](GenerateStream* s) { s->ClientCancelled(); });
  EXPECT_EQ(st, absl::CancelledError("cancelled by the client"));
  st = Ending({absl::OkStatus(), cancelled}, true, nothing);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  // An image's own error comes first, even past the deadline.
  st = Ending({cancelled, absl::ResourceExhaustedError("no memory")}, false,
              [](GenerateStream* s) { EXPECT_TRUE(s->DeadlinePassed(At(1500))); });
  EXPECT_EQ(st, absl::ResourceExhaustedError("no memory"));
  // A failed write ends the call as cancelled, even when every image succeeded.
  st = Ending({absl::OkStatus(), absl::OkStatus()}, false, [](GenerateStream* s) {
    ASSERT_EQ(s->Flush(At(0), false).kind, Action::kWrite);
    s->WriteDone(false);
  });
  EXPECT_EQ(st, absl::CancelledError("cancelled by the client"));
}

TEST(GenerateStreamTest, AFailedPngEndsTheCallAfterTheChunk) {
  GenerateStream s(TwoImages());
  for (int64_t i : {0, 1}) {
    s.Admitted(i, At(1));
    Sample(&s, i, 0, 6, 2);
    s.Done(i, absl::OkStatus());
  }
  Action a = s.Flush(At(3), false);
  ASSERT_EQ(a.kind, Action::kWrite);
  ASSERT_TRUE(a.chunk.has_summary);
  s.EncodeFailed(1, absl::InternalError("PNG encoding failed: x"));
  s.WriteDone(true);
  a = s.Flush(At(4), false);
  ASSERT_EQ(a.kind, Action::kFinish);
  EXPECT_EQ(a.status, absl::InternalError("PNG encoding failed: x"));
}

TEST(GenerateStreamTest, AFlushThatThrewFinishesOnceWithItsError) {
  GenerateStream s(TwoImages());
  ASSERT_EQ(s.Flush(At(0), false).kind, Action::kWrite);
  const absl::Status err = absl::InternalError("Generate: internal error: boom");
  EXPECT_TRUE(s.Fail(err));  // the caller finishes the call and cancels the engine requests
  EXPECT_TRUE(s.finished());
  EXPECT_FALSE(s.Fail(err));
  EXPECT_FALSE(s.WantsSteps());
  s.Done(0, absl::CancelledError("cancelled"));
  s.Done(1, absl::CancelledError("cancelled"));
  EXPECT_EQ(s.Flush(At(10), false).kind, Action::kNothing);
}

}  // namespace
}  // namespace krause::server
