// ResumeState (client/resume.h), the resuming client's plan, driven message by message with a
// fake clock: what the caller sees (every row once, in order; images under their own index;
// one summary), what is asked after a break (completions from the rows received, the seed with
// first_image i, the first attempt's version; untouched images together), when (RetryInfo, else
// backoff), when it gives up, and that a replica computing otherwise is not spliced in. The
// end-to-end proof is chaos_test (real replicas killed mid-stream).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "client/resume.h"
#include "server/edge/status.h"

namespace krause::client {
namespace {

using Clock = ResumeState::Clock;
constexpr uint32_t kH = 4, kW = 2, kC = 1;  // 4 rows of 2 subpixels
constexpr uint64_t kSeed = 100;

v1::GenerateRequest Request(uint32_t images) {
  v1::GenerateRequest r;
  r.set_model("karm");
  r.set_num_images(images);
  r.set_seed(kSeed);
  r.set_temperature(0.5f);
  r.set_label("Sneaker");
  return r;
}

std::string Row(int64_t image, int64_t row) {
  return std::string(kW * kC, static_cast<char>(10 * image + row));
}

v1::GenerateResponse Start() {
  v1::GenerateResponse m;
  v1::GenerateStart* s = m.mutable_start();
  s->set_model("karm");
  s->set_model_version("3");
  s->set_seed(kSeed);
  s->set_height(kH);
  s->set_width(kW);
  s->set_channels(kC);
  return m;
}

// Rows [first, first + n) of `image` (the attempt's index `j`).
void AddRows(v1::GenerateResponse* m, uint32_t j, int64_t image, int64_t first, int64_t n) {
  v1::ImageRows* r = m->add_rows();
  r->set_image(j);
  r->set_first_row(static_cast<uint32_t>(first));
  r->set_num_rows(static_cast<uint32_t>(n));
  for (int64_t k = first; k < first + n; ++k) *r->mutable_pixels() += Row(image, k);
}

void AddImage(v1::GenerateResponse* m, uint32_t j, uint64_t seed) {
  v1::GeneratedImage* g = m->add_images();
  g->set_image(j);
  g->set_seed(seed);
  g->set_png("png-" + std::to_string(seed));
}

// What the caller received, per image: the rows in order (their pixels), and the PNGs.
struct Seen {
  std::vector<std::string> rows = std::vector<std::string>(8);
  std::vector<std::string> png = std::vector<std::string>(8);
  void Take(const std::optional<v1::GenerateResponse>& m) {
    if (!m) return;
    for (const auto& r : m->rows()) {
      ASSERT_EQ(rows[r.image()].size(), r.first_row() * kW * kC) << "a gap or a duplicate";
      rows[r.image()] += r.pixels();
    }
    for (const auto& g : m->images()) {
      ASSERT_TRUE(png[g.image()].empty()) << "an image twice";
      png[g.image()] = g.png();
    }
  }
};

std::string Rows(int64_t image, int64_t n) {
  std::string s;
  for (int64_t k = 0; k < n; ++k) s += Row(image, k);
  return s;
}

const grpc::Status kReset(grpc::StatusCode::UNAVAILABLE, "Socket closed");

TEST(ResumeState, AnUnbrokenStreamPassesThroughWithOneSummary) {
  const Clock::time_point t0{};
  ResumeState s(Request(2), ResumeOptions{}, 7, t0);
  const auto a = s.First();
  EXPECT_EQ(a.request.seed(), kSeed);
  EXPECT_TRUE(a.request.stream_rows());
  EXPECT_EQ(a.request.num_images(), 2u);
  Seen seen;
  v1::GenerateResponse m = Start();
  AddRows(&m, 0, 0, 0, 2);
  seen.Take(s.OnMessage(a.id, m, t0));
  v1::GenerateResponse m2;
  AddRows(&m2, 0, 0, 2, 2);
  AddRows(&m2, 1, 1, 0, 4);
  AddImage(&m2, 0, kSeed);
  AddImage(&m2, 1, kSeed + 1);
  m2.mutable_summary()->set_flops_executed(5);
  m2.mutable_progress()->set_pixels_done(16);
  seen.Take(s.OnMessage(a.id, m2, t0));
  EXPECT_TRUE(s.OnEnd(a.id, grpc::Status::OK, "p", false, t0).empty());
  ASSERT_TRUE(s.done());
  EXPECT_TRUE(s.status().ok());
  EXPECT_EQ(seen.rows[0], Rows(0, 4));
  EXPECT_EQ(seen.rows[1], Rows(1, 4));
  EXPECT_EQ(seen.png[1], "png-101");
  const v1::GenerateResponse last = s.Last(t0 + std::chrono::seconds(2));
  EXPECT_EQ(last.summary().model_version(), "3");
  EXPECT_EQ(last.summary().seed(), kSeed);
  EXPECT_EQ(last.summary().flops_executed(), 5);
  EXPECT_EQ(last.summary().seconds(), 2);
  EXPECT_EQ(last.progress().pixels_done(), last.progress().pixels_total());
  EXPECT_EQ(s.stats().attempts, 1);
  EXPECT_EQ(s.stats().resumed_calls, 0);
}

TEST(ResumeState, ASeedIsFixedWhenTheRequestHasNone) {
  v1::GenerateRequest r = Request(1);
  r.clear_seed();
  ResumeState s(r, ResumeOptions{}, 4242, Clock::time_point{});
  EXPECT_EQ(s.First().request.seed(), 4242u);
}

TEST(ResumeState, ABreakResumesEachImageFromItsRowsAndTheUntouchedOnesTogether) {
  const Clock::time_point t0{};
  ResumeState s(Request(5), ResumeOptions{}, 7, t0);
  const auto a = s.First();
  // Image 0 finished, image 1 has 2 rows, image 2 all 4 rows but no PNG, 3 and 4 nothing.
  v1::GenerateResponse m = Start();
  AddRows(&m, 0, 0, 0, 4);
  AddImage(&m, 0, kSeed);
  AddRows(&m, 1, 1, 0, 2);
  AddRows(&m, 2, 2, 0, 4);
  m.mutable_progress()->set_pixels_done(8 + 6 + 8);  // 3 rows of image 1 were sampled
  Seen seen;
  seen.Take(s.OnMessage(a.id, m, t0));
  const auto next = s.OnEnd(a.id, kReset, "ipv4:127.0.0.1:1", false, t0);
  ASSERT_FALSE(s.done());
  ASSERT_EQ(next.size(), 3u);
  // Image 1: a completion from its 2 rows, the call's seed with first_image 1, the first
  // attempt's version.
  EXPECT_EQ(next[0].images, std::vector<int64_t>({1}));
  EXPECT_EQ(next[0].request.seed(), kSeed);
  EXPECT_EQ(next[0].request.first_image(), 1u);
  EXPECT_EQ(next[0].request.num_images(), 1u);
  EXPECT_EQ(next[0].request.prompt_rows(), 2u);
  EXPECT_EQ(next[0].request.prompt().raw().pixels(), Rows(1, 2));
  EXPECT_EQ(next[0].request.prompt().raw().height(), 2u);
  EXPECT_EQ(next[0].request.version(), "3");
  EXPECT_EQ(next[0].request.label(), "Sneaker");
  EXPECT_FLOAT_EQ(next[0].request.temperature(), 0.5f);
  // Image 2: every row came but not the image: its first 3 rows (a prompt is shorter).
  EXPECT_EQ(next[1].request.prompt_rows(), kH - 1);
  EXPECT_EQ(next[1].request.seed(), kSeed);
  EXPECT_EQ(next[1].request.first_image(), 2u);
  // Images 3 and 4: one call, the seed with first_image 3, no prompt.
  EXPECT_EQ(next[2].images, std::vector<int64_t>({3, 4}));
  EXPECT_EQ(next[2].request.num_images(), 2u);
  EXPECT_EQ(next[2].request.seed(), kSeed);
  EXPECT_EQ(next[2].request.first_image(), 3u);
  EXPECT_FALSE(next[2].request.has_prompt());
  // No RetryInfo: the first backoff.
  EXPECT_EQ(next[0].not_before, t0 + std::chrono::milliseconds(50));
  EXPECT_EQ(s.stats().resumed_calls, 3);
  EXPECT_EQ(s.stats().images_resumed, 4);
  EXPECT_EQ(s.stats().rows_kept, 2 + 3);
  EXPECT_EQ(s.stats().rows_recomputed, 1);  // the third row of image 1 was lost
  ASSERT_EQ(s.stats().breaks.size(), 1u);
  EXPECT_EQ(s.stats().breaks[0], "ipv4:127.0.0.1:1: UNAVAILABLE: Socket closed");

  // The resumed calls echo their prompt rows first: the caller sees each row once.
  v1::GenerateResponse r1 = Start();
  AddRows(&r1, 0, 1, 0, 4);
  AddImage(&r1, 0, kSeed + 1);
  seen.Take(s.OnMessage(next[0].id, r1, t0));
  v1::GenerateResponse r2 = Start();
  AddRows(&r2, 0, 2, 0, 4);
  AddImage(&r2, 0, kSeed + 2);
  seen.Take(s.OnMessage(next[1].id, r2, t0));
  v1::GenerateResponse r3 = Start();
  AddRows(&r3, 0, 3, 0, 4);
  AddRows(&r3, 1, 4, 0, 4);
  AddImage(&r3, 0, kSeed + 3);
  AddImage(&r3, 1, kSeed + 4);
  seen.Take(s.OnMessage(next[2].id, r3, t0));
  for (const auto& n : next) EXPECT_TRUE(s.OnEnd(n.id, grpc::Status::OK, "q", false, t0).empty());
  ASSERT_TRUE(s.done());
  EXPECT_TRUE(s.status().ok());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(seen.rows[i], Rows(i, 4)) << i;
    EXPECT_EQ(seen.png[i], "png-" + std::to_string(kSeed + i)) << i;
  }
  EXPECT_EQ(s.stats().attempts, 4);
}

// A resumed attempt on a replica that computes otherwise (GenerateStart.numerics: another
// precision, implementation, CPU kernel family or dtype) would continue the images with other
// bits: the call fails, naming both, and nothing of that attempt reaches the caller.
TEST(ResumeState, AReplicaWithOtherNumericsIsNotSplicedIn) {
  const Clock::time_point t0{};
  ResumeState s(Request(1), ResumeOptions{}, 7, t0);
  const auto a = s.First();
  v1::GenerateResponse m = Start();
  m.mutable_start()->set_numerics("fp32 fused_cpu on cpu, avx2 kernel family");
  AddRows(&m, 0, 0, 0, 2);
  Seen seen;
  seen.Take(s.OnMessage(a.id, m, t0));
  const auto next = s.OnEnd(a.id, kReset, "ipv4:127.0.0.1:1", false, t0);
  ASSERT_EQ(next.size(), 1u);
  // The same numerics resume as usual; this one comes from a replica with the base kernels.
  v1::GenerateResponse r = Start();
  r.mutable_start()->set_numerics("fp32 fused_cpu on cpu, base kernel family");
  AddRows(&r, 0, 0, 0, 4);
  AddImage(&r, 0, kSeed);
  EXPECT_FALSE(s.OnMessage(next[0].id, r, t0).has_value());
  ASSERT_TRUE(s.done());
  EXPECT_EQ(s.status().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.status().error_message(),
              ::testing::HasSubstr("\"fp32 fused_cpu on cpu, base kernel family\", the stream "
                                   "began with \"fp32 fused_cpu on cpu, avx2 kernel family\""));
  EXPECT_EQ(seen.rows[0], Rows(0, 2));  // what came before the break, and nothing after
  EXPECT_TRUE(seen.png[0].empty());
}

TEST(ResumeState, RetryInfoSetsTheDelayAndBreaksInARowBackOff) {
  const Clock::time_point t0{};
  ResumeState s(Request(1), ResumeOptions{}, 7, t0);
  auto a = s.First();
  // DRAINING: at once (RetryInfo 0).
  const grpc::Status draining = server::ToGrpcStatus(
      server::Refusal("the server is shutting down", server::reason::kDraining));
  auto n = s.OnEnd(a.id, draining, "p", false, t0);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].not_before, t0);
  // QUEUE_FULL: its RetryInfo.
  const grpc::Status full =
      server::ToGrpcStatus(server::Refusal("queue is full", server::reason::kQueueFull));
  n = s.OnEnd(n[0].id, full, "p", false, t0);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].not_before, t0 + server::kQueueFullRetryDelay);
  // Without details: 50 ms doubling with each break without progress (third break: 200 ms).
  n = s.OnEnd(n[0].id, kReset, "p", false, t0);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].not_before, t0 + std::chrono::milliseconds(200));
}

TEST(ResumeState, GivesUpOnAnErrorABreakCannotCureOrTooManyBreaks) {
  const Clock::time_point t0{};
  {  // INVALID_ARGUMENT: the caller's error, not the replica's.
    ResumeState s(Request(1), ResumeOptions{}, 7, t0);
    const grpc::Status bad(grpc::StatusCode::INVALID_ARGUMENT, "top_k");
    EXPECT_TRUE(s.OnEnd(s.First().id, bad, "p", false, t0).empty());
    ASSERT_TRUE(s.done());
    EXPECT_EQ(s.status().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {  // CANCELLED reaching the state is the server's (the client's own cancel ends the call
     // before): resumed.
    ResumeState s(Request(1), ResumeOptions{}, 7, t0);
    const grpc::Status cancelled(grpc::StatusCode::CANCELLED, "CANCELLED");
    EXPECT_EQ(s.OnEnd(s.First().id, cancelled, "p", false, t0).size(), 1u);
    EXPECT_FALSE(s.done());
  }
  {  // resume off: the break is the call's status.
    ResumeOptions o;
    o.resume = false;
    ResumeState s(Request(1), o, 7, t0);
    EXPECT_TRUE(s.OnEnd(s.First().id, kReset, "p", false, t0).empty());
    ASSERT_TRUE(s.done());
    EXPECT_EQ(s.status().error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  {  // max_resumes: the third break of a call allowing two fails it.
    ResumeOptions o;
    o.max_resumes = 2;
    ResumeState s(Request(1), o, 7, t0);
    auto n = s.OnEnd(s.First().id, kReset, "p", false, t0);
    n = s.OnEnd(n.at(0).id, kReset, "p", false, t0);
    n = s.OnEnd(n.at(0).id, kReset, "p", false, t0);
    EXPECT_TRUE(n.empty());
    ASSERT_TRUE(s.done());
    EXPECT_EQ(s.stats().resumed_calls, 2);
  }
  {  // max_resumes counts breaks, not the calls one break makes: a break of a 3-image call whose
     // images all have rows resumes them as 3 calls and uses one break of the two allowed.
    ResumeOptions o;
    o.max_resumes = 2;
    ResumeState s(Request(3), o, 7, t0);
    const auto a = s.First();
    v1::GenerateResponse m = Start();
    for (uint32_t i = 0; i < 3; ++i) AddRows(&m, i, i, 0, 1);
    s.OnMessage(a.id, m, t0);
    const auto n = s.OnEnd(a.id, kReset, "p", false, t0);
    ASSERT_EQ(n.size(), 3u);
    EXPECT_EQ(s.OnEnd(n.at(0).id, kReset, "p", false, t0).size(), 1u);  // the second break
    EXPECT_FALSE(s.done());
    EXPECT_TRUE(s.OnEnd(n.at(1).id, kReset, "p", false, t0).empty());  // the third: given up
    ASSERT_TRUE(s.done());
    EXPECT_EQ(s.stats().breaks.size(), 2u);
  }
  {  // The whole call's deadline passed: no more attempts.
    ResumeOptions o;
    o.deadline_seconds = 1;
    ResumeState s(Request(1), o, 7, t0);
    EXPECT_TRUE(s.OnEnd(s.First().id, kReset, "p", false, t0 + std::chrono::seconds(2)).empty());
    EXPECT_TRUE(s.done());
  }
  {  // An attempt's own timeout is resumed; a DEADLINE_EXCEEDED the caller set is not.
    ResumeState s(Request(1), ResumeOptions{}, 7, t0);
    const grpc::Status late(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
    EXPECT_EQ(s.OnEnd(s.First().id, late, "p", /*timed_out=*/true, t0).size(), 1u);
    ResumeState u(Request(1), ResumeOptions{}, 7, t0);
    EXPECT_TRUE(u.OnEnd(u.First().id, late, "p", /*timed_out=*/false, t0).empty());
    EXPECT_TRUE(u.done());
  }
}

TEST(ResumeState, RowsAreWithheldWhenTheCallerDidNotAskForThem) {
  const Clock::time_point t0{};
  v1::GenerateRequest r = Request(1);
  r.set_stream_rows(false);
  ResumeState s(r, ResumeOptions{}, 7, t0);
  const auto a = s.First();
  EXPECT_TRUE(a.request.stream_rows());  // asked anyway: a resume needs them
  v1::GenerateResponse m = Start();
  AddRows(&m, 0, 0, 0, 2);
  const auto out = s.OnMessage(a.id, m, t0);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->rows_size(), 0);
  EXPECT_EQ(out->progress().pixels_done(), 2u * kW * kC);
  const auto n = s.OnEnd(a.id, kReset, "p", false, t0);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].request.prompt_rows(), 2u);  // resumed from the withheld rows
}

}  // namespace
}  // namespace krause::client
