// GeneratorWorker (server/core/generator_worker.h) routing each engine step's output to the calls:
// a call's receiver gets its own images only, in its own image indices, each subpixel once and in
// order, each image admitted once and done once, and the same images the engine makes for the
// same requests alone; Cancel(call) stops that call's images and no other's; Submit is all or
// none; Stop() tells every live call. The worker runs on its own thread: the tests wait on the
// receivers' condition variables (a 20 s bound turns a hang into a failure), never on a sleep.
#include "server/core/generator_worker.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "server/core/errors.h"
#include "tests/test_util.h"

namespace krause::server {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

std::shared_ptr<const PixelModel> TinyModel(int64_t height) {
  PixelModelConfig c;
  c.attention = AttentionKind::kKrause;
  c.height = height;
  c.width_px = 4;
  c.channels = 1;
  c.d_model = 16;
  c.depth = 1;
  c.heads = 2;
  c.window = 6;
  c.top_k = 3;
  c.start_token = true;
  return std::make_shared<const PixelModel>(PixelModel::Create(c, 3).value());
}

GenerationRequest Request(uint64_t seed, std::vector<uint8_t> prompt = {}) {
  GenerationRequest r;
  r.sampling.seed = seed;
  r.prompt = std::move(prompt);
  return r;
}

// Records what the worker hands one call.
class Recorder : public GenerationReceiver {
 public:
  Recorder(int64_t images, std::vector<size_t> prompt_lengths)
      : pixels_(images), admitted_(images, 0), first_index_(std::move(prompt_lengths)) {}

  void OnUpdate(const CallUpdate& u) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++updates_;
    EXPECT_LE(u.admitted_at, u.now);
    for (int64_t image : u.admitted) {
      ++admitted_.at(image);
      admitted_at_[image] = u.admitted_at;
    }
    for (const CallUpdate::Pixel& p : u.pixels) {
      std::vector<uint8_t>& px = pixels_.at(p.image);
      EXPECT_EQ(p.index, static_cast<int64_t>(first_index_.at(p.image) + px.size()))
          << "image " << p.image;
      px.push_back(p.value);
    }
    for (const CallUpdate::Done& d : u.done) {
      EXPECT_FALSE(done_.count(d.image)) << "image " << d.image << " done twice";
      done_[d.image] = d.status;
    }
    stopping_ = stopping_ || u.stopping;
    if (updates_ == 1) {
      first_update_admitted_ = 0;
      for (int a : admitted_) first_update_admitted_ += a;
    }
    cv_.notify_all();
  }
  // Waits for the first update; returns how many images had a slot by then (-1 after 20 s).
  int FirstUpdateAdmitted() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return updates_ > 0; })) return -1;
    return first_update_admitted_;
  }

  // Waits until every image is done (false after 20 s).
  bool WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20),
                        [&] { return done_.size() == pixels_.size(); });
  }
  // Waits until `image` has at least one subpixel.
  bool WaitStarted(int64_t image) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return !pixels_[image].empty(); });
  }
  std::vector<std::vector<uint8_t>> pixels() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pixels_;
  }
  std::map<int64_t, absl::Status> done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  std::vector<int> admitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return admitted_;
  }
  // When each image's step began admitting it (the steps' start times order the admissions).
  std::map<int64_t, Clock::time_point> admitted_at() const {
    std::lock_guard<std::mutex> lock(mu_);
    return admitted_at_;
  }
  bool stopping() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }
  int64_t updates() const {
    std::lock_guard<std::mutex> lock(mu_);
    return updates_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, Clock::time_point> admitted_at_;
  std::vector<std::vector<uint8_t>> pixels_;  // sampled subpixels per image
  std::vector<int> admitted_;
  std::vector<size_t> first_index_;
  std::map<int64_t, absl::Status> done_;
  bool stopping_ = false;
  int64_t updates_ = 0;
  int first_update_admitted_ = -1;
};

// What the engine alone makes of the same request: its sampled subpixels.
std::vector<uint8_t> Alone(const PixelModel& m, GenerationRequest r) {
  auto engine = DecodeEngine::Create(&m, EngineOptions{1, 0}).value();
  const size_t prompt = r.prompt.size();
  EXPECT_TRUE(engine->Submit(std::move(r)).ok());
  const std::vector<uint8_t> image = RunUntilIdle(engine.get()).begin()->second.image;
  return std::vector<uint8_t>(image.begin() + prompt, image.end());
}

GeneratorOptions Slots(int64_t slots) {
  GeneratorOptions o;
  o.engine.max_sequences = slots;
  return o;
}

TEST(GeneratorWorker, EachCallGetsItsOwnImagesInItsOwnIndices) {
  const auto m = TinyModel(5);  // 20 subpixels
  auto worker = GeneratorWorker::Create(m, Slots(3)).value();
  const std::vector<uint8_t> prompt = {9, 8, 7, 6, 5};
  auto a = std::make_shared<Recorder>(3, std::vector<size_t>{0, 0, 5});
  auto b = std::make_shared<Recorder>(2, std::vector<size_t>{0, 0});
  ASSERT_TRUE(worker->Submit({Request(10), Request(11), Request(12, prompt)}, a).ok());
  ASSERT_TRUE(worker->Submit({Request(20), Request(21)}, b).ok());
  ASSERT_TRUE(a->WaitDone());
  ASSERT_TRUE(b->WaitDone());
  const auto pa = a->pixels(), pb = b->pixels();
  EXPECT_EQ(pa[0], Alone(*m, Request(10)));
  EXPECT_EQ(pa[1], Alone(*m, Request(11)));
  EXPECT_EQ(pa[2], Alone(*m, Request(12, prompt)));
  EXPECT_EQ(pb[0], Alone(*m, Request(20)));
  EXPECT_EQ(pb[1], Alone(*m, Request(21)));
  EXPECT_EQ(a->admitted(), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(b->admitted(), (std::vector<int>{1, 1}));
  for (const auto& [image, st] : a->done()) EXPECT_TRUE(st.ok()) << image << ": " << st;
  for (const auto& [image, st] : b->done()) EXPECT_TRUE(st.ok()) << image << ": " << st;
  EXPECT_FALSE(a->stopping());
  EXPECT_EQ(worker->active(), 0);
}

// With one reply thread, the order of the updates is the order of the flushes: a running
// stream's must not queue behind a burst of newer calls'. Two calls are submitted so that their
// receivers' addresses run against their arrival (an order by address fails this test).
TEST(GeneratorWorker, UpdatesGoOutOldestCallFirst) {
  struct Entry {
    const GenerationReceiver* who;
    Clock::time_point iteration;  // CallUpdate::now: the same for every call of one iteration
  };
  std::mutex mu;
  std::vector<Entry> log;
  class Logged : public Recorder {
   public:
    Logged(std::mutex* mu, std::vector<Entry>* log) : Recorder(1, {0}), mu_(mu), log_(log) {}
    void OnUpdate(const CallUpdate& u) override {
      {
        std::lock_guard<std::mutex> lock(*mu_);
        log_->push_back({this, u.now});
      }
      Recorder::OnUpdate(u);
    }

   private:
    std::mutex* mu_;
    std::vector<Entry>* log_;
  };
  const auto m = TinyModel(5);
  // The worker holds after its first step until both calls are in: the older runs at most one
  // step alone, however slowly this thread submits the newer (under TSan it did not keep up).
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  bool both_in = false;
  auto worker = GeneratorWorker::Create(m, Slots(2), [&](const DecodeEvent&) {
                  std::unique_lock<std::mutex> hold(hold_mu);
                  hold_cv.wait(hold, [&] { return both_in; });
                }).value();
  auto p = std::make_shared<Logged>(&mu, &log), q = std::make_shared<Logged>(&mu, &log);
  const auto older = p.get() > q.get() ? p : q, newer = p.get() > q.get() ? q : p;
  ASSERT_TRUE(worker->Submit({Request(1)}, older).ok());
  ASSERT_TRUE(worker->Submit({Request(2)}, newer).ok());
  {
    std::lock_guard<std::mutex> hold(hold_mu);
    both_in = true;
  }
  hold_cv.notify_all();
  ASSERT_TRUE(older->WaitDone());
  ASSERT_TRUE(newer->WaitDone());
  std::lock_guard<std::mutex> lock(mu);
  int both = 0;  // iterations that updated both calls
  for (size_t i = 0; i + 1 < log.size(); ++i) {
    if (log[i].iteration != log[i + 1].iteration) continue;
    ++both;
    EXPECT_EQ(log[i].who, older.get()) << "update " << i;
    EXPECT_EQ(log[i + 1].who, newer.get()) << "update " << i + 1;
  }
  EXPECT_GE(both, 15);  // 20 subpixels each, two slots: they run side by side
}

// A call whose images all wait for a cache slot hears from the worker while it waits (what lets
// a Generate call send its start, with its waiting count, before any pixel).
// The worker is held at its second step until the waiting call is in, so that the busy image
// still holds the one slot then, however slowly this thread goes (under load in a parallel ctest
// run the busy image once finished before the second Submit, and the waiting call got the slot).
TEST(GeneratorWorker, ACallWaitingForASlotGetsUpdatesBeforeItsFirstPixel) {
  auto model = TinyModel(64);
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  bool release = false;
  int steps = 0;
  auto worker = GeneratorWorker::Create(model, Slots(1), [&](const DecodeEvent&) {
                  std::unique_lock<std::mutex> hold(hold_mu);
                  if (++steps >= 2) hold_cv.wait(hold, [&] { return release; });
                }).value();
  auto busy = std::make_shared<Recorder>(1, std::vector<size_t>{0});
  ASSERT_TRUE(worker->Submit({Request(1)}, busy).ok());
  ASSERT_TRUE(busy->WaitStarted(0));
  auto waiting = std::make_shared<Recorder>(2, std::vector<size_t>{0, 0});
  ASSERT_TRUE(worker->Submit({Request(2), Request(3)}, waiting).ok());
  {
    std::lock_guard<std::mutex> hold(hold_mu);
    release = true;
  }
  hold_cv.notify_all();
  EXPECT_EQ(waiting->FirstUpdateAdmitted(), 0) << "its first update came with a slot, or never";
  EXPECT_TRUE(waiting->pixels()[0].empty() || waiting->admitted()[0] == 1);
  worker->Cancel(busy.get());
  ASSERT_TRUE(waiting->WaitDone());
  ASSERT_TRUE(busy->WaitDone());
  worker->Stop();
}

TEST(GeneratorWorker, CancelStopsOneCallOnly) {
  const auto m = TinyModel(64);  // 256 subpixels: a call outlasts the test's next lines
  auto worker = GeneratorWorker::Create(m, Slots(2)).value();
  auto a = std::make_shared<Recorder>(1, std::vector<size_t>{0});
  auto b = std::make_shared<Recorder>(2, std::vector<size_t>{0, 0});
  ASSERT_TRUE(worker->Submit({Request(1)}, a).ok());
  ASSERT_TRUE(worker->Submit({Request(2), Request(3)}, b).ok());  // one waits for a slot
  ASSERT_TRUE(b->WaitStarted(0));
  worker->Cancel(b.get());
  ASSERT_TRUE(b->WaitDone());
  ASSERT_TRUE(a->WaitDone());
  for (const auto& [image, st] : b->done()) EXPECT_TRUE(absl::IsCancelled(st)) << image;
  EXPECT_TRUE(a->done().at(0).ok());
  EXPECT_EQ(a->pixels()[0], Alone(*m, Request(1)));
  EXPECT_LT(b->pixels()[0].size(), 256u);
  worker->Cancel(b.get());  // done already: no effect
}

// Cache slots go to the tenant holding the fewest for its weight (PlanAdmission), not to the
// oldest call: with tenant A's two calls and tenant B's call of two images waiting when A's first
// two images finish, one slot goes to A's older call and one to B, and so on. A tenant with a
// call waiting at its max_queued is refused (TENANT_LIMIT); the other tenant is not.
TEST(GeneratorWorker, SlotsAreSharedBetweenTenantsAndMaxQueuedRefusesOnlyItsTenant) {
  const auto m = TinyModel(16);
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  bool release = false;
  int steps = 0;
  // Held from its second step (the first delivers the first pixels) until the calls are in; no
  // slot frees before the first call's images end anyway.
  auto worker = GeneratorWorker::Create(m, Slots(2), [&](const DecodeEvent&) {
                  std::unique_lock<std::mutex> hold(hold_mu);
                  if (++steps >= 2) hold_cv.wait(hold, [&] { return release; });
                }).value();
  Share a;  // the default tenant, weight 1
  Share b;
  b.tenant = 1;
  auto spec = std::make_shared<TenantSpec>();
  spec->name = "team-b";
  spec->max_queued = 1;
  b.spec = spec;
  auto first = std::make_shared<Recorder>(2, std::vector<size_t>{0, 0});
  ASSERT_TRUE(worker->Submit({Request(1), Request(2)}, first, a).ok());  // both slots
  ASSERT_TRUE(first->WaitStarted(0));
  auto a3 = std::make_shared<Recorder>(1, std::vector<size_t>{0});
  auto a4 = std::make_shared<Recorder>(1, std::vector<size_t>{0});
  auto b56 = std::make_shared<Recorder>(2, std::vector<size_t>{0, 0});
  ASSERT_TRUE(worker->Submit({Request(3)}, a3, a).ok());
  ASSERT_TRUE(worker->Submit({Request(4)}, a4, a).ok());
  ASSERT_TRUE(worker->Submit({Request(5), Request(6)}, b56, b).ok());
  auto b7 = std::make_shared<Recorder>(1, std::vector<size_t>{0});
  const absl::Status refused = worker->Submit({Request(7)}, b7, b);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("tenant team-b is at its max_queued of 1")));
  EXPECT_EQ(DetailsOf(refused).reason, "TENANT_LIMIT");
  auto a8 = std::make_shared<Recorder>(1, std::vector<size_t>{0});
  ASSERT_TRUE(worker->Submit({Request(8)}, a8, a).ok());  // tenant A has no max_queued
  {
    std::lock_guard<std::mutex> hold(hold_mu);
    release = true;
  }
  hold_cv.notify_all();
  for (const auto& r : {first, a3, a4, b56, a8}) ASSERT_TRUE(r->WaitDone());
  // A's first two finish together: A's oldest waiting call and B's first image take the slots
  // (not A's two older calls, as oldest-first would); then A's next call beside B's second.
  const Clock::time_point t3 = a3->admitted_at().at(0), t4 = a4->admitted_at().at(0);
  EXPECT_EQ(b56->admitted_at().at(0), t3);
  EXPECT_LT(t3, t4);
  EXPECT_EQ(b56->admitted_at().at(1), t4);
  EXPECT_LT(t4, a8->admitted_at().at(0));
  EXPECT_EQ(b56->pixels()[1], Alone(*m, Request(6)));  // the same image, whoever shares the step
  worker->Stop();
}

TEST(GeneratorWorker, SubmitIsAllOrNone) {
  const auto m = TinyModel(5);
  // The worker is held after its first step until the busy receiver's second call was refused,
  // so the first call is still running then, however slowly this thread goes (under ctest -j2 it
  // once finished both images first, and the second call went through).
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  bool release = false;
  auto worker = GeneratorWorker::Create(m, Slots(2), [&](const DecodeEvent&) {
                  std::unique_lock<std::mutex> hold(hold_mu);
                  hold_cv.wait(hold, [&] { return release; });
                }).value();
  auto r = std::make_shared<Recorder>(2, std::vector<size_t>{0, 0});
  GenerationRequest bad = Request(2);
  bad.sampling.top_p = 0;
  EXPECT_THAT(worker->Submit({Request(1), bad}, r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_p")));
  EXPECT_THAT(worker->Submit({}, r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least one image")));
  EXPECT_THAT(worker->Submit({Request(1)}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("receiver of its own")));
  EXPECT_EQ(worker->waiting(), 0);
  // Nothing was queued: the receiver is free for a call that passes.
  ASSERT_TRUE(worker->Submit({Request(1), Request(2)}, r).ok());
  EXPECT_THAT(worker->Submit({Request(3)}, r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("receiver of its own")));
  {
    std::lock_guard<std::mutex> hold(hold_mu);
    release = true;
  }
  hold_cv.notify_all();
  ASSERT_TRUE(r->WaitDone());
  EXPECT_EQ(r->admitted(), (std::vector<int>{1, 1}));
}

TEST(GeneratorWorker, StopTellsEveryLiveCall) {
  const auto m = TinyModel(64);
  // The worker is held at its second step (after the first was delivered) until Stop has begun,
  // so image 0 is still running when the worker sees the stop, however slowly this thread goes
  // (under load in CI it once finished the whole image before Stop was called).
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  bool release = false;
  int steps = 0;
  auto worker = GeneratorWorker::Create(m, Slots(1), [&](const DecodeEvent&) {
                  std::unique_lock<std::mutex> hold(hold_mu);
                  if (++steps >= 2) hold_cv.wait(hold, [&] { return release; });
                }).value();
  auto r = std::make_shared<Recorder>(2, std::vector<size_t>{0, 0});
  ASSERT_TRUE(worker->Submit({Request(1), Request(2)}, r).ok());
  ASSERT_TRUE(r->WaitStarted(0));
  std::thread stopper([&] { worker->Stop(); });  // returns once every image is done
  // Stop has begun once a new call is refused as shutting down (probes that came earlier just
  // wait for a slot, or are refused because the waiting room is full: that refusal is not the
  // stop, and taking it for one let image 0 finish before a slow stopper thread began).
  for (;;) {
    const absl::Status probe =
        worker->Submit({Request(9)}, std::make_shared<Recorder>(1, std::vector<size_t>{0}));
    if (!probe.ok() && absl::StrContains(probe.message(), "shutting down")) break;
  }
  {
    std::lock_guard<std::mutex> hold(hold_mu);
    release = true;
  }
  hold_cv.notify_all();
  stopper.join();
  EXPECT_TRUE(r->stopping());
  ASSERT_EQ(r->done().size(), 2u);
  for (const auto& [image, st] : r->done())
    EXPECT_TRUE(absl::IsCancelled(st)) << image << ": " << st;
  EXPECT_THAT(worker->Submit({Request(3)}, std::make_shared<Recorder>(1, std::vector<size_t>{0})),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
}

// An Inspect job (ScoreJob::work) runs on the worker thread beside a running stream, with the
// model and the serving implementation; the stream's image is unchanged. A cancelled one is
// dropped with CANCELLED and its work never runs.
TEST(GeneratorWorker, InspectJobsRunBesideStreamsAndAreDroppedWhenCancelled) {
  const auto m = TinyModel(16);
  auto worker = GeneratorWorker::Create(m, Slots(2)).value();
  auto r = std::make_shared<Recorder>(1, std::vector<size_t>{0});
  ASSERT_TRUE(worker->Submit({Request(1)}, r).ok());
  ASSERT_TRUE(r->WaitStarted(0));
  std::mutex mu;
  std::condition_variable cv;
  std::vector<absl::Status> done;
  bool ran_on_model = false, cancelled_ran = false;
  auto job = [&](bool cancelled, bool* ran) {
    ScoreJob j;
    j.images = at::zeros({1, m->config().seq_len()}, at::kByte);
    j.cancelled = [cancelled] { return cancelled; };
    j.work = [&, ran](const PixelModel& model, KrauseImpl) {
      std::lock_guard<std::mutex> lock(mu);
      *ran = &model == m.get();
      return absl::OkStatus();
    };
    j.done = [&](absl::StatusOr<std::vector<double>> bits) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_TRUE(!bits.ok() || bits->empty());
      done.push_back(bits.status());
      cv.notify_all();
    };
    return j;
  };
  ASSERT_TRUE(worker->EnqueueScore(job(true, &cancelled_ran)).ok());
  ASSERT_TRUE(worker->EnqueueScore(job(false, &ran_on_model)).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return done.size() == 2; }));
    EXPECT_TRUE(absl::IsCancelled(done[0]));
    EXPECT_TRUE(done[1].ok());
    EXPECT_TRUE(ran_on_model);
    EXPECT_FALSE(cancelled_ran);
  }
  ASSERT_TRUE(r->WaitDone());
  EXPECT_EQ(r->pixels()[0], Alone(*m, Request(1)));
}

}  // namespace
}  // namespace krause::server
