// The serving schedulers' plans (server/core/scheduling.h), exactly, with a fake clock: which
// classify requests form a batch and when the batcher wakes; how a generator's worker shares its
// time between decode steps, prefills and Score chunks. No threads, no sleeps.
#include "server/core/scheduling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace krause::server {
namespace {

using ::testing::ElementsAre;
using ms = std::chrono::milliseconds;
using us = std::chrono::microseconds;

const Clock::time_point kT0 = Clock::time_point(std::chrono::hours(1));  // the fake clock's zero

QueuedClassify Q(int64_t images, Clock::duration enqueued_at,
                 Clock::time_point deadline = Clock::time_point::max(), bool cancelled = false) {
  return QueuedClassify{images, kT0 + enqueued_at, deadline, cancelled};
}

std::vector<size_t> Dropped(const ClassifyPlan& p) {
  std::vector<size_t> out;
  for (const auto& d : p.drop) out.push_back(d.index);
  return out;
}

TEST(PlanClassifyBatch, AnIdleBatcherRunsARequestAtOnce) {
  const ClassifyPlanOptions o{64, Clock::duration::zero()};
  const ClassifyPlan p = PlanClassifyBatch({Q(1, ms(0))}, kT0, o);
  EXPECT_THAT(p.take, ElementsAre(0u));
  EXPECT_TRUE(p.drop.empty());
}

TEST(PlanClassifyBatch, RequestsQueuedDuringABatchFormTheNextWholeUpToTheLimit) {
  const ClassifyPlanOptions o{8, Clock::duration::zero()};
  // Arrived while the previous batch ran: 3 + 4 fit in 8, the third (2 more) waits.
  const std::vector<QueuedClassify> q = {Q(3, ms(1)), Q(4, ms(2)), Q(2, ms(3)), Q(1, ms(4))};
  const ClassifyPlan p = PlanClassifyBatch(q, kT0 + ms(5), o);
  EXPECT_THAT(p.take, ElementsAre(0u, 1u));
  // A request larger than the limit alone still runs (requests are never split).
  EXPECT_THAT(PlanClassifyBatch({Q(9, ms(0)), Q(1, ms(0))}, kT0, o).take, ElementsAre(0u));
  // Nothing queued: sleep until new work.
  const ClassifyPlan idle = PlanClassifyBatch({}, kT0, o);
  EXPECT_TRUE(idle.take.empty());
  EXPECT_EQ(idle.wake_at, Clock::time_point::max());
}

TEST(PlanClassifyBatch, AQueueDelayWaitsForCompanyUntilDueOrFull) {
  const ClassifyPlanOptions o{8, ms(5)};
  const std::vector<QueuedClassify> q = {Q(2, ms(0)), Q(3, ms(2))};
  ClassifyPlan p = PlanClassifyBatch(q, kT0 + ms(3), o);
  EXPECT_TRUE(p.take.empty());
  EXPECT_EQ(p.wake_at, kT0 + ms(5));  // the oldest's arrival + 5 ms
  p = PlanClassifyBatch(q, kT0 + ms(5), o);
  EXPECT_THAT(p.take, ElementsAre(0u, 1u));
  // Full before due: at once.
  p = PlanClassifyBatch({Q(5, ms(0)), Q(3, ms(1))}, kT0 + ms(1), o);
  EXPECT_THAT(p.take, ElementsAre(0u, 1u));
  // A deadline before the batch is due wakes the batcher to drop it.
  p = PlanClassifyBatch({Q(1, ms(0)), Q(1, ms(1), kT0 + ms(4))}, kT0 + ms(2), o);
  EXPECT_EQ(p.wake_at, kT0 + ms(4));
}

TEST(PlanClassifyBatch, ExpiredAndCancelledRequestsLeaveWhereverTheyAre) {
  const ClassifyPlanOptions o{8, Clock::duration::zero()};
  const std::vector<QueuedClassify> q = {Q(1, ms(0), kT0 + ms(2)), Q(2, ms(0)),
                                         Q(1, ms(1), Clock::time_point::max(), true), Q(3, ms(1))};
  const ClassifyPlan p = PlanClassifyBatch(q, kT0 + ms(2), o);
  EXPECT_THAT(Dropped(p), ElementsAre(0u, 2u));
  EXPECT_EQ(p.drop[0].why.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(p.drop[1].why.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(p.take, ElementsAre(1u, 3u));
  // Stopping: everything leaves UNAVAILABLE, nothing runs.
  const ClassifyPlan stop = PlanClassifyBatch(q, kT0, o, /*stopping=*/true);
  EXPECT_THAT(Dropped(stop), ElementsAre(0u, 1u, 2u, 3u));
  EXPECT_EQ(stop.drop[1].why.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(stop.take.empty());
}

// A request of `tenant` (its weight) and `priority`, arrived at kT0 + `at`.
QueuedClassify T(int32_t tenant, Clock::duration at, double weight = 1, int priority = 0,
                 int64_t images = 1) {
  QueuedClassify q = Q(images, at);
  q.tenant = tenant;
  q.weight = weight;
  q.priority = priority;
  return q;
}

// Tenants: a client with one request is not queued behind another tenant's flood. Tenant 0 has
// ten requests queued, tenant 1 one that came last: it is the batch's second (the first goes to
// the older head on the tie), and tenant 0 fills the rest.
TEST(PlanClassifyBatch, ATenantsOneRequestJoinsTheNextBatchBesideAnothersFlood) {
  const ClassifyPlanOptions o{4, Clock::duration::zero()};
  std::vector<QueuedClassify> q;
  for (int i = 0; i < 10; ++i) q.push_back(T(0, ms(i)));
  q.push_back(T(1, ms(20)));
  const ClassifyPlan p = PlanClassifyBatch(q, kT0 + ms(30), o);
  EXPECT_THAT(p.take, ElementsAre(0u, 10u, 1u, 2u));
  // The clock after it: tenant 0 has had 3 images, tenant 1 one; the last taken started at 2.
  EXPECT_THAT(p.clock.tenant, ElementsAre(3.0, 1.0));
  EXPECT_EQ(p.clock.last, 2.0);
}

// Weights: with both tenants always backlogged, batch after batch, tenant 0 of weight 3 gets
// three images for each of tenant 1's (and an image is an image: a request of 2 counts twice).
TEST(PlanClassifyBatch, BacklogedTenantsShareBatchesByWeight) {
  const ClassifyPlanOptions o{4, Clock::duration::zero()};
  std::vector<QueuedClassify> q;
  for (int i = 0; i < 20; ++i) q.push_back(T(i % 2, ms(i), i % 2 == 0 ? 3.0 : 1.0));
  FairClock clock;
  int64_t served[2] = {0, 0};
  for (int batch = 0; batch < 4; ++batch) {
    const ClassifyPlan p = PlanClassifyBatch(q, kT0 + ms(100), o, false, clock);
    ASSERT_EQ(p.take.size(), 4u);
    std::vector<char> taken(q.size(), 0);
    for (size_t i : p.take) {
      ++served[q[i].tenant];
      taken[i] = 1;
    }
    std::vector<QueuedClassify> rest;
    for (size_t i = 0; i < q.size(); ++i)
      if (!taken[i]) rest.push_back(q[i]);
    // Keep both backlogged: a new request of each tenant behind the rest.
    q = rest;
    for (int t = 0; t < 2; ++t) q.push_back(T(t, ms(50 + batch), t == 0 ? 3.0 : 1.0));
    clock = p.clock;
  }
  EXPECT_EQ(served[0], 12);
  EXPECT_EQ(served[1], 4);
  // Two images weigh twice one: tenant 1's request of 2 against tenant 0's single images.
  const ClassifyPlan p = PlanClassifyBatch(
      {T(0, ms(0)), T(0, ms(1)), T(0, ms(2)), T(1, ms(3), 1.0, 0, 2), T(1, ms(4), 1.0, 0, 2)},
      kT0 + ms(10), ClassifyPlanOptions{6, Clock::duration::zero()});
  EXPECT_THAT(p.take, ElementsAre(0u, 3u, 1u, 2u));  // 5 images; the next 2 do not fit in 6
}

// A tenant that had nothing queued starts from the last request's virtual time: its idle time
// is no credit, so it alternates with the busy tenant instead of taking every slot.
TEST(PlanClassifyBatch, IdlingEarnsATenantNoCredit) {
  FairClock clock;
  clock.tenant = {100.5, 0.0};  // tenant 0 busy for long; tenant 1 last seen long ago
  clock.last = 100;
  const ClassifyPlan p =
      PlanClassifyBatch({T(0, ms(0)), T(0, ms(1)), T(1, ms(2)), T(1, ms(3))}, kT0 + ms(10),
                        {4, Clock::duration::zero()}, false, clock);
  EXPECT_THAT(p.take, ElementsAre(2u, 0u, 3u, 1u));
}

// Priority orders a tenant's own requests: a priority-1 request behind a flood of priority-0
// ones of the same tenant is the next batch's first.
TEST(PlanClassifyBatch, PriorityOrdersATenantsOwnRequests) {
  std::vector<QueuedClassify> q;
  for (int i = 0; i < 8; ++i) q.push_back(T(0, ms(i)));
  q.push_back(T(0, ms(9), 1.0, 1));
  const ClassifyPlan p = PlanClassifyBatch(q, kT0 + ms(10), {2, Clock::duration::zero()});
  EXPECT_THAT(p.take, ElementsAre(8u, 0u));
}

// A batch's plan gives each request's start time, in the batch's order.
TEST(PlanClassifyBatch, GivesEachTakenRequestsStartTime) {
  const ClassifyPlan p = PlanClassifyBatch({T(0, ms(0)), T(0, ms(1)), T(1, ms(2), 1.0, 0, 2)},
                                           kT0 + ms(5), {8, Clock::duration::zero()});
  EXPECT_THAT(p.take, ElementsAre(0u, 2u, 1u));
  EXPECT_THAT(p.start, ElementsAre(0.0, 0.0, 1.0));
}

// Cut-ins: tenant 0's batch of 64 has reached virtual time 20 (tenant 0 is at 64, its queued
// requests past the batch); tenant 1, idle since 3, cuts in with its head request, at 20, and
// advances to 21; its second request waits (one request per tenant per plan).
TEST(PlanClassifyCutIn, ATenantBehindTheBatchCutsInOneRequestAtTheBatchsVirtualTime) {
  FairClock clock;
  clock.tenant = {64.0, 3.0};
  clock.last = 63;
  const std::vector<char> batch_tenants = {1};
  const std::vector<QueuedClassify> q = {T(0, ms(0)), T(1, ms(1)), T(0, ms(2)), T(1, ms(3))};
  const ClassifyPlan p = PlanClassifyCutIn(q, kT0 + ms(5), 20.0, 64, clock, batch_tenants);
  EXPECT_THAT(p.take, ElementsAre(1u));
  EXPECT_THAT(p.start, ElementsAre(20.0));
  EXPECT_THAT(p.clock.tenant, ElementsAre(64.0, 21.0));
  EXPECT_EQ(p.clock.last, 63.0);
  EXPECT_TRUE(p.drop.empty());
  // Its next one cuts in once the batch has reached 21 (a tie goes to the tenant outside the
  // batch: it has had no more than its share), not before.
  EXPECT_TRUE(
      PlanClassifyCutIn({T(1, ms(3))}, kT0 + ms(6), 20.5, 64, p.clock, batch_tenants).take.empty());
  EXPECT_THAT(PlanClassifyCutIn({T(1, ms(3))}, kT0 + ms(6), 21.0, 64, p.clock, batch_tenants).take,
              ElementsAre(0u));
}

// The batch's own tenants never cut in, however far behind; neither do expired or cancelled
// requests (left for the next batch's plan to drop), nor a tenant ahead of the batch.
TEST(PlanClassifyCutIn, NotTheBatchsTenantsNorDeadRequestsNorATenantAhead) {
  FairClock clock;
  clock.tenant = {10.0, 0.0, 0.0};
  std::vector<QueuedClassify> q = {T(0, ms(0)), T(1, ms(1)), T(2, ms(2))};
  q[1].cancelled = true;
  q[2].deadline = kT0 + ms(4);
  const std::vector<char> batch_tenants = {0, 0, 0};
  EXPECT_TRUE(PlanClassifyCutIn(q, kT0 + ms(5), 5.0, 64, clock, batch_tenants).take.empty());
  // Tenant 0 of weight 1 at 10 is behind 12, unless it is the batch's.
  EXPECT_THAT(PlanClassifyCutIn(q, kT0 + ms(5), 12.0, 64, clock, batch_tenants).take,
              ElementsAre(0u));
  EXPECT_TRUE(PlanClassifyCutIn(q, kT0 + ms(5), 12.0, 64, clock, {1}).take.empty());
  EXPECT_TRUE(PlanClassifyCutIn(q, kT0 + ms(5), 9.5, 64, clock, batch_tenants).take.empty());
}

// Several tenants behind: the least virtual time first, within a tenant its highest priority;
// whole requests up to max_images, the first that does not fit ends the plan; a weight of 2
// advances a tenant half as far.
TEST(PlanClassifyCutIn, LeastServedFirstWholeRequestsUpToTheLimit) {
  FairClock clock;
  clock.tenant = {100.0, 7.0, 5.0, 6.0};
  const std::vector<char> batch_tenants = {1};
  const std::vector<QueuedClassify> q = {T(1, ms(0), 2.0, 0, 2), T(1, ms(1), 2.0, 1, 2),
                                         T(2, ms(2), 1.0, 0, 3), T(3, ms(3), 1.0, 0, 4)};
  ClassifyPlan p = PlanClassifyCutIn(q, kT0 + ms(5), 50.0, 5, clock, batch_tenants);
  EXPECT_THAT(p.take, ElementsAre(2u));  // 3 images; tenant 3's 4 more do not fit in 5
  EXPECT_THAT(p.clock.tenant, ElementsAre(100.0, 7.0, 53.0, 6.0));
  p = PlanClassifyCutIn(q, kT0 + ms(5), 50.0, 64, clock, batch_tenants);
  EXPECT_THAT(p.take, ElementsAre(2u, 3u, 1u));  // tenant 1's priority-1 request
  EXPECT_THAT(p.start, ElementsAre(50.0, 50.0, 50.0));
  EXPECT_THAT(p.clock.tenant, ElementsAre(100.0, 51.0, 53.0, 54.0));
}

TEST(RunOnArrival, OnlyAnIdleCpuBatcherWithoutDelayRunsOnTheArrivingThread) {
  ClassifyArrival idle;
  idle.caller_may_run = true;
  idle.images = 1;
  EXPECT_TRUE(RunOnArrival(idle));
  ClassifyArrival a = idle;
  a.queue_empty = false;  // others wait: join them, do not overtake
  EXPECT_FALSE(RunOnArrival(a));
  a = idle;
  a.batch_running = true;  // natural batching: arrivals form the next batch
  EXPECT_FALSE(RunOnArrival(a));
  a = idle;
  a.stopping = true;
  EXPECT_FALSE(RunOnArrival(a));
  a = idle;
  a.caller_may_run = false;  // a GPU batcher
  EXPECT_FALSE(RunOnArrival(a));
  a = idle;
  a.max_queue_delay = ms(2);  // waits for company by request
  EXPECT_FALSE(RunOnArrival(a));
  a = idle;
  a.images = 64;
  EXPECT_TRUE(RunOnArrival(a));
  a.images = 65;
  EXPECT_FALSE(RunOnArrival(a));
  a = idle;
  a.flops = kMaxArrivalFlops;  // up to a billion operations: the arriving thread runs it
  EXPECT_TRUE(RunOnArrival(a));
  a.flops = 8.6e9;  // a paper-size ViT-S/16 image: the batcher thread's team
  EXPECT_FALSE(RunOnArrival(a));
}

TEST(SideWorkCredit, EarnsAShareOfDecodeTimeUpToTheSlice) {
  GeneratorSchedulingOptions o;
  o.side_share = 0.25;  // side work earns 1/3 of decode time
  o.side_slice_seconds = 0.006;
  SideWorkCredit c(o);
  EXPECT_DOUBLE_EQ(c.seconds(), 0.006);  // starts with a slice
  c.OnSideWork(0.010);
  EXPECT_DOUBLE_EQ(c.seconds(), -0.004);
  c.OnDecode(0.006);
  EXPECT_DOUBLE_EQ(c.seconds(), -0.002);
  c.OnDecode(0.009);
  EXPECT_DOUBLE_EQ(c.seconds(), 0.001);
  c.OnDecode(1.0);
  EXPECT_DOUBLE_EQ(c.seconds(), 0.006);  // capped
  o.side_share = 1.0;                    // no limit
  SideWorkCredit all(o);
  all.OnSideWork(1.0);
  all.OnDecode(0.0);
  EXPECT_DOUBLE_EQ(all.seconds(), 0.006);
}

// Waiting requests of one slot each with these prefill positions (ids 1, 2, ...).
std::vector<WaitingRequest> Waiting(std::vector<int64_t> tokens) {
  std::vector<WaitingRequest> w;
  for (size_t i = 0; i < tokens.size(); ++i)
    w.push_back({static_cast<int64_t>(i + 1), 1, tokens[i], {}});
  return w;
}

int64_t Admitted(const WorkerPlan& p) { return static_cast<int64_t>(p.admission.ids.size()); }

TEST(PlanWorkerIteration, WithNothingDecodingSideWorkTakesASlicePerIteration) {
  GeneratorSchedulingOptions o;
  o.side_slice_seconds = 0.010;
  WorkerState s;
  s.free_slots = 3;
  s.waiting = Waiting({400, 400, 400, 400});
  s.seconds_per_prefill_token = 1e-5;  // 4 ms each: two fit in the 10 ms slice
  s.credit_seconds = -1;               // no credit needed while idle
  s.score_images_left = 16;
  s.seconds_per_score_image = 0.002;
  WorkerPlan p = PlanWorkerIteration(s, o);
  EXPECT_EQ(Admitted(p), 2);
  EXPECT_EQ(p.score_images, 1);  // 2 ms left of the slice buys one image
  EXPECT_TRUE(p.step);
  // Cheap admissions: all that fit the free slots.
  s.seconds_per_prefill_token = 1e-7;
  EXPECT_EQ(Admitted(PlanWorkerIteration(s, o)), 3);
  // No one waiting: a Score chunk of a slice (10 ms / 2 ms), so that a request arriving meanwhile
  // waits for 5 images, not 16.
  s.waiting.clear();
  p = PlanWorkerIteration(s, o);
  EXPECT_EQ(p.score_images, 5);
  EXPECT_FALSE(p.step);
  // Nothing at all: no step.
  EXPECT_FALSE(PlanWorkerIteration(WorkerState{}, o).step);
}

TEST(PlanWorkerIteration, WhileDecodingSideWorkSpendsOnlyTheCredit) {
  GeneratorSchedulingOptions o;
  o.side_slice_seconds = 0.010;
  WorkerState s;
  s.decoding = 5;
  s.free_slots = 59;
  s.waiting = Waiting({100, 200, 300, 400});
  s.seconds_per_prefill_token = 1e-5;  // 1, 2, 3, 4 ms
  s.score_images_left = 16;
  s.seconds_per_score_image = 0.002;
  s.credit_seconds = 0.0045;
  WorkerPlan p = PlanWorkerIteration(s, o);
  EXPECT_EQ(Admitted(p), 2);     // 1 + 2 ms fit in 4.5 ms, + 3 would not
  EXPECT_EQ(p.score_images, 1);  // what is left (1.5 ms) buys no image: at least one
  EXPECT_TRUE(p.step);
  // No credit: decode only; the burst waits.
  s.credit_seconds = 0;
  p = PlanWorkerIteration(s, o);
  EXPECT_EQ(Admitted(p), 0);
  EXPECT_EQ(p.score_images, 0);
  EXPECT_TRUE(p.step);
  // A little credit: at least one admission, even if it costs more than the credit.
  s.credit_seconds = 1e-6;
  s.waiting = Waiting({700});
  p = PlanWorkerIteration(s, o);
  EXPECT_EQ(Admitted(p), 1);
  EXPECT_EQ(p.score_images, 0);  // the admission spent it
  // Score chunks while decoding are sized to the credit, within the slice and the job.
  s.waiting.clear();
  s.credit_seconds = 0.0081;
  EXPECT_EQ(PlanWorkerIteration(s, o).score_images, 4);  // 8.1 ms / 2 ms
  s.score_images_left = 3;
  EXPECT_EQ(PlanWorkerIteration(s, o).score_images, 3);
  // An unknown cost: one image, to measure it.
  s.seconds_per_score_image = 0;
  EXPECT_EQ(PlanWorkerIteration(s, o).score_images, 1);
  // Requests without a prompt cost no prefill: all admitted on any credit.
  s.waiting = Waiting({0, 0, 0});
  s.credit_seconds = 1e-9;
  EXPECT_EQ(Admitted(PlanWorkerIteration(s, o)), 3);
  // ... but never more than the free slots.
  s.free_slots = 2;
  EXPECT_EQ(Admitted(PlanWorkerIteration(s, o)), 2);
  // A prefill whose cost was never measured goes alone (it measures the cost), idle or not.
  s.free_slots = 8;
  s.seconds_per_prefill_token = 0;
  s.waiting = Waiting({0, 300, 300, 0});
  s.credit_seconds = 0.005;
  EXPECT_EQ(Admitted(PlanWorkerIteration(s, o)), 2);  // the promptless one, then one prefill
  s.decoding = 0;
  EXPECT_EQ(Admitted(PlanWorkerIteration(s, o)), 2);
}

// A tenant whose image finished is expected back for return_window_seconds (its share of the
// slots is kept for it meanwhile: PlanAdmission), the last image of each tenant counting.
TEST(WorkerLedger, ATenantIsExpectedBackForTheReturnWindowAfterItsImageFinished) {
  GeneratorSchedulingOptions o;
  o.return_window_seconds = 0.05;
  WorkerLedger l(o);
  const Clock::time_point t0 = Clock::time_point() + std::chrono::seconds(100);
  FairShare a, b;
  b.group = 1;
  b.weight = 3;
  WorkerState s;
  l.Fill(&s, t0);
  EXPECT_TRUE(s.expected.empty());
  l.OnDone(a, t0);
  l.OnDone(b, t0 + std::chrono::milliseconds(30));
  l.Fill(&s, t0 + std::chrono::milliseconds(50));
  ASSERT_EQ(s.expected.size(), 2u);
  EXPECT_EQ(s.expected[1].group, 1);
  EXPECT_EQ(s.expected[1].weight, 3);
  l.Fill(&s, t0 + std::chrono::milliseconds(51));  // A's window has passed; B's has not
  ASSERT_EQ(s.expected.size(), 1u);
  EXPECT_EQ(s.expected[0].group, 1);
  l.Fill(&s, t0 + std::chrono::milliseconds(81));
  EXPECT_TRUE(s.expected.empty());
}

// The worker's bookkeeping: the credit earned by decode steps and spent by side work while
// sequences decode, and the smoothed costs (0.7 old + 0.3 new) the next plan sizes units with.
TEST(WorkerLedger, KeepsTheCreditAndTheMeasuredCosts) {
  GeneratorSchedulingOptions o;  // a third: a decode step earns half its time; cap 5 ms
  o.side_slice_seconds = 0.005;
  WorkerLedger l(o);
  WorkerState s;
  l.Fill(&s, Clock::time_point());
  EXPECT_DOUBLE_EQ(s.credit_seconds, 0.005);
  EXPECT_EQ(s.seconds_per_prefill_token, 0);  // unknown
  EXPECT_EQ(s.seconds_per_score_image, 0);
  l.OnScore(0.004, 2, /*decoding=*/false);  // idle: measured, no credit spent
  l.Fill(&s, Clock::time_point());
  EXPECT_DOUBLE_EQ(s.seconds_per_score_image, 0.002);
  EXPECT_DOUBLE_EQ(s.credit_seconds, 0.005);
  l.OnScore(0.012, 2, true);
  l.Fill(&s, Clock::time_point());
  EXPECT_NEAR(s.seconds_per_score_image, 0.7 * 0.002 + 0.3 * 0.006, 1e-15);
  EXPECT_NEAR(s.credit_seconds, -0.007, 1e-15);
  // A step: its decode earns first (0.004 / 2), then its prefills spend.
  l.OnStep(100, 0.002, 0.004, true);
  l.Fill(&s, Clock::time_point());
  EXPECT_NEAR(s.credit_seconds, -0.007 + 0.002 - 0.002, 1e-15);
  EXPECT_DOUBLE_EQ(s.seconds_per_prefill_token, 2e-5);
  l.OnStep(0, 0, 0.010, true);  // no prefill: the cost stays
  l.Fill(&s, Clock::time_point());
  EXPECT_NEAR(s.credit_seconds, -0.002, 1e-15);
  EXPECT_DOUBLE_EQ(s.seconds_per_prefill_token, 2e-5);
  l.OnStep(50, 0.002, 0, false);  // prefills while idle: measured, free
  l.Fill(&s, Clock::time_point());
  EXPECT_NEAR(s.credit_seconds, -0.002, 1e-15);
  EXPECT_NEAR(s.seconds_per_prefill_token, 0.7 * 2e-5 + 0.3 * 4e-5, 1e-18);
  l.OnStep(0, 0, 1.0, true);  // capped at the slice
  l.Fill(&s, Clock::time_point());
  EXPECT_DOUBLE_EQ(s.credit_seconds, 0.005);
}

TEST(PlanWorkerIteration, OverALongRunSideWorkTakesItsShare) {
  // The worker's loop with a fake clock: decode steps of 1 ms, Score images of 3 ms, share 0.5.
  GeneratorSchedulingOptions o;
  o.side_share = 0.5;
  o.side_slice_seconds = 0.005;
  SideWorkCredit credit(o);
  double decode = 0, side = 0;
  for (int i = 0; i < 10000; ++i) {
    WorkerState s;
    s.decoding = 1;
    s.score_images_left = 1000;
    s.seconds_per_score_image = 0.003;
    s.credit_seconds = credit.seconds();
    const WorkerPlan p = PlanWorkerIteration(s, o);
    if (p.score_images > 0) {
      side += 0.003 * p.score_images;
      credit.OnSideWork(0.003 * p.score_images);
    }
    ASSERT_TRUE(p.step);
    decode += 0.001;
    credit.OnDecode(0.001);
  }
  EXPECT_NEAR(side / (side + decode), 0.5, 0.01);
}

// Side work of a classifier's batcher (Inspect): turns with the batches, drops like requests.
TEST(PlanSideWork, SideJobsTakeTurnsWithBatches) {
  const std::vector<QueuedSide> one = {QueuedSide{}};
  // No batch due: a side job runs, back to back with the previous one.
  SidePlan p = PlanSideWork(one, kT0, /*batch_due=*/false, /*last_was_side=*/true);
  EXPECT_TRUE(p.run);
  EXPECT_EQ(p.index, 0u);
  // A batch due after a batch: the side job goes first, then the batch.
  EXPECT_TRUE(PlanSideWork(one, kT0, true, false).run);
  // A batch due after a side job: the batch goes first (a request waits for one side job at most).
  EXPECT_FALSE(PlanSideWork(one, kT0, true, true).run);
  // Nothing queued: nothing to run.
  EXPECT_FALSE(PlanSideWork({}, kT0, false, false).run);
}

TEST(PlanSideWork, ExpiredCancelledAndStoppingJobsAreDropped) {
  const std::vector<QueuedSide> q = {QueuedSide{kT0 + ms(1), false}, QueuedSide{kT0 + ms(9), true},
                                     QueuedSide{kT0 + ms(9), false}};
  SidePlan p = PlanSideWork(q, kT0 + ms(2), false, false);
  ASSERT_EQ(p.drop.size(), 2u);
  EXPECT_EQ(p.drop[0].index, 0u);
  EXPECT_EQ(p.drop[0].why.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(p.drop[1].index, 1u);
  EXPECT_EQ(p.drop[1].why.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(p.run);
  EXPECT_EQ(p.index, 2u);  // the oldest live one
  p = PlanSideWork(q, kT0, false, false, /*stopping=*/true);
  EXPECT_EQ(p.drop.size(), 3u);
  EXPECT_EQ(p.drop[2].why.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(p.run);
}

// A generator's Inspect is a Score job of one image: while sequences decode it runs only on
// credit, so a running stream is delayed by at most its own compute per decode step's share.
TEST(PlanWorkerIteration, AnInspectIsOneScoreImageUnderTheBudget) {
  GeneratorSchedulingOptions o;
  WorkerState s;
  s.decoding = 3;
  s.free_slots = 61;
  s.score_images_left = 1;
  s.seconds_per_score_image = 0.050;  // far over the slice and the credit
  s.credit_seconds = 0;
  WorkerPlan p = PlanWorkerIteration(s, o);
  EXPECT_EQ(p.score_images, 0);  // no credit: decode only
  EXPECT_TRUE(p.step);
  s.credit_seconds = 1e-4;
  p = PlanWorkerIteration(s, o);
  EXPECT_EQ(p.score_images, 1);  // any credit: the one image, then decode steps repay it
  EXPECT_TRUE(p.step);
}

}  // namespace
}  // namespace krause::server
