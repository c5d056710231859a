// PlanAdmission (model/engine/admission.h), the decode engine's one admission rule, case by case
// with exact outcomes: oldest first, a guided request's two slots (and the requests behind it
// waiting), the free slots, the prefill budget, the first admission whatever its cost, a prefill
// of unknown cost ending the plan; between share groups (tenants) the least served for its
// weight first, slot limits, priority within a group; and PrefillPositions.
#include "model/engine/admission.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace krause {
namespace {

using Ids = std::vector<int64_t>;

WaitingRequest W(int64_t id, int64_t slots, int64_t tokens) { return {id, slots, tokens}; }

// `slots` held by `group` (weight 1 unless given).
GroupSlots H(int32_t group, int64_t slots, double weight = 1) {
  GroupSlots h;
  h.share.group = group;
  h.share.weight = weight;
  h.slots = slots;
  return h;
}

// A one-slot request of `group` (weight, slot limit, priority).
WaitingRequest G(int64_t id, int32_t group, double weight = 1, int priority = 0,
                 int64_t max_slots = 0, int64_t slots = 1) {
  WaitingRequest w{id, slots, 0};
  w.share.group = group;
  w.share.weight = weight;
  w.share.priority = priority;
  w.share.max_slots = max_slots;
  return w;
}

AdmissionBudget Budget(int64_t free_slots, double seconds = std::numeric_limits<double>::infinity(),
                       double per_token = 0) {
  AdmissionBudget b;
  b.free_slots = free_slots;
  b.seconds = seconds;
  b.seconds_per_token = per_token;
  return b;
}

TEST(PlanAdmission, OldestFirstWhileSlotsAreFree) {
  const std::vector<WaitingRequest> q = {W(4, 1, 0), W(5, 1, 0), W(9, 1, 0), W(12, 1, 0)};
  EXPECT_EQ(PlanAdmission(q, Budget(3)).ids, (Ids{4, 5, 9}));
  EXPECT_EQ(PlanAdmission(q, Budget(3)).slots, 3);
  EXPECT_EQ(PlanAdmission(q, Budget(8)).ids, (Ids{4, 5, 9, 12}));
  EXPECT_TRUE(PlanAdmission(q, Budget(0)).ids.empty());
  EXPECT_TRUE(PlanAdmission({}, Budget(8)).ids.empty());
}

TEST(PlanAdmission, AGuidedRequestWaitsForTwoSlotsAndTheQueueWaitsBehindIt) {
  const std::vector<WaitingRequest> q = {W(1, 1, 0), W(2, 2, 10), W(3, 1, 3)};
  EXPECT_EQ(PlanAdmission(q, Budget(4)).ids, (Ids{1, 2, 3}));
  EXPECT_EQ(PlanAdmission(q, Budget(4)).slots, 4);
  // Two slots: 1 takes one, 2 needs two and waits, and 3 (which would fit) waits behind it.
  EXPECT_EQ(PlanAdmission(q, Budget(2)).ids, (Ids{1}));
  EXPECT_EQ(PlanAdmission(q, Budget(3)).ids, (Ids{1, 2}));
  // A guided request at the head with one free slot: nobody.
  EXPECT_TRUE(PlanAdmission({W(2, 2, 0), W(3, 1, 0)}, Budget(1)).ids.empty());
}

TEST(PlanAdmission, ABudgetStopsAdmissionsButNeverTheFirst) {
  const std::vector<WaitingRequest> q = {W(1, 1, 100), W(2, 1, 200), W(3, 1, 300), W(4, 1, 0)};
  // 1, 2, 3 ms at 1e-5 s per position: 1 + 2 fit in 4.5 ms, + 3 would not (and 4, free, waits
  // behind 3).
  AdmissionPlan p = PlanAdmission(q, Budget(8, 0.0045, 1e-5));
  EXPECT_EQ(p.ids, (Ids{1, 2}));
  EXPECT_DOUBLE_EQ(p.seconds, 0.003);
  // The first is admitted even when it alone is over the budget.
  p = PlanAdmission(q, Budget(8, 1e-6, 1e-5));
  EXPECT_EQ(p.ids, (Ids{1}));
  EXPECT_DOUBLE_EQ(p.seconds, 0.001);
  // Requests without a prefill cost nothing: all of them on any budget.
  EXPECT_EQ(PlanAdmission({W(1, 1, 0), W(2, 1, 0), W(3, 1, 0)}, Budget(8, 1e-9, 1e-5)).ids,
            (Ids{1, 2, 3}));
  // ... but never more than the free slots.
  EXPECT_EQ(PlanAdmission({W(1, 1, 0), W(2, 1, 0), W(3, 1, 0)}, Budget(2, 1e-9, 1e-5)).ids,
            (Ids{1, 2}));
}

TEST(PlanAdmission, APrefillOfUnknownCostEndsABudgetedPlan) {
  const std::vector<WaitingRequest> q = {W(1, 1, 0), W(2, 1, 300), W(3, 1, 300), W(4, 1, 0)};
  // The promptless one, then one prefill (which measures the cost).
  EXPECT_EQ(PlanAdmission(q, Budget(8, 0.005, 0)).ids, (Ids{1, 2}));
  // Without a budget the cost does not matter: everything that fits.
  EXPECT_EQ(PlanAdmission(q, Budget(8)).ids, (Ids{1, 2, 3, 4}));
}

TEST(PlanAdmission, TheGroupHoldingLeastForItsWeightGoesFirst) {
  // A holds 3 slots, B none; equal weights: B's two go first although A's are older, then A's.
  std::vector<WaitingRequest> q = {G(1, 0), G(2, 0), G(3, 0), G(4, 0), G(5, 1), G(6, 1)};
  AdmissionBudget b = Budget(4);
  b.held = {H(0, 3), H(1, 0)};
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{5, 6, 1, 2}));
  // Both holding 2: turn about, the older head first on a tie.
  b.held = {H(0, 2), H(1, 2)};
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{1, 5, 2, 6}));
  // Without `held` every group holds none.
  b.held.clear();
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{1, 5, 2, 6}));
}

TEST(PlanAdmission, SlotsFollowTheWeights) {
  // A (weight 3) ids 1..8, B (weight 1) ids 9..16, eight free slots, none held: six to A, two to
  // B, in the order of their slots per weight (ties to the older head).
  std::vector<WaitingRequest> q;
  for (int64_t id = 1; id <= 8; ++id) q.push_back(G(id, 0, 3));
  for (int64_t id = 9; id <= 16; ++id) q.push_back(G(id, 1, 1));
  EXPECT_EQ(PlanAdmission(q, Budget(8)).ids, (Ids{1, 9, 2, 3, 4, 10, 5, 6}));
  // A full engine at 3:1 (A 48, B 16 of 64): a freed slot goes to whoever is below its share.
  AdmissionBudget b = Budget(1);
  b.held = {H(0, 47, 3), H(1, 16)};
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{1}));
  b.held = {H(0, 48, 3), H(1, 15)};
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{9}));
}

TEST(PlanAdmission, SlotsUpToItsShareAreKeptForAGroupExpectedBack) {
  // B (ids 9..16) waits; A holds and waits nothing. Eight free slots.
  std::vector<WaitingRequest> q;
  for (int64_t id = 9; id <= 16; ++id) q.push_back(G(id, 1));
  EXPECT_EQ(PlanAdmission(q, Budget(8)).ids.size(), 8u);  // A is gone: B takes every slot
  // A's images just finished (its clients' next calls are on the way): its share, 4 of 8, is
  // kept; B takes its own 4.
  AdmissionBudget b = Budget(8);
  b.expected = {G(0, 0).share};
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{9, 10, 11, 12}));
  // A at weight 3: 6 of 8 kept (B's share is 2).
  b.expected[0].weight = 3;
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{9, 10}));
  // A still holds 5 of its 6 (3 free): one slot kept for it, B takes 2.
  b = Budget(3);
  b.held = {H(0, 5, 3)};
  b.expected = {G(0, 0, 3).share};
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{9, 10}));
  // One of A's calls is back (a request waits): it takes its turn by share, and nothing more is
  // kept (A holds 5 and asks for 1 of its 6).
  q.push_back(G(20, 0, 3));
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{9, 10, 20}));
  // With 8 free and A holding none, A's one request and 5 more slots are kept from B: B gets its
  // 2 and A its request, turn about (on the tie at none held, B's older head first).
  b = Budget(8);
  b.expected = {G(0, 0, 3).share};
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{9, 20, 10}));
}

TEST(PlanAdmission, AGroupAtItsSlotLimitWaitsAndTheOthersGoOn) {
  // B may hold 2 and holds 1: one more B, then A's, although B holds less.
  const std::vector<WaitingRequest> q = {G(1, 0), G(2, 0), G(5, 1, 1, 0, 2), G(6, 1, 1, 0, 2),
                                         G(7, 1, 1, 0, 2)};
  AdmissionBudget b = Budget(4);
  b.held = {H(0, 4), H(1, 1)};
  EXPECT_EQ(PlanAdmission(q, b).ids, (Ids{5, 1, 2}));
  // A guided request (two slots) with one left under the limit waits; so do B's others behind it.
  const std::vector<WaitingRequest> g = {G(1, 0), G(5, 1, 1, 0, 2, 2), G(6, 1, 1, 0, 2)};
  EXPECT_EQ(PlanAdmission(g, b).ids, (Ids{1}));
}

TEST(PlanAdmission, PriorityOrdersAGroupsRequestsAndTheNextGroupsHeadThatDoesNotFitEndsThePlan) {
  // One group: highest priority first, the oldest of a level first.
  const std::vector<WaitingRequest> q = {G(1, 0, 1, 0), G(2, 0, 1, 1), G(3, 0, 1, 0), G(4, 0, 1, 2),
                                         G(5, 0, 1, 1)};
  EXPECT_EQ(PlanAdmission(q, Budget(8)).ids, (Ids{4, 2, 5, 1, 3}));
  // Priority does not cross groups: B's priority-2 request waits for its turn by share (after
  // A's first, both then hold one, and A's next is older).
  AdmissionBudget b = Budget(2);
  b.held = {H(0, 0), H(1, 1)};
  EXPECT_EQ(PlanAdmission({G(1, 0), G(2, 0), G(3, 1, 1, 2)}, b).ids, (Ids{1, 2}));
  // The next request by share is guided and one slot is free: nobody, A's one-slot request too.
  b = Budget(1);
  b.held = {H(0, 1), H(1, 0)};
  EXPECT_TRUE(PlanAdmission({G(1, 0), G(2, 1, 1, 0, 0, 2)}, b).ids.empty());
}

TEST(PrefillPositions, EveryKnownInputButTheLast) {
  // With a start token: [START, prompt...] less the last, i.e. the prompt's length.
  EXPECT_EQ(PrefillPositions(0, true), 0);
  EXPECT_EQ(PrefillPositions(5, true), 5);
  // Without: the prompt less its last subpixel; an empty prompt starts from a drawn x_0.
  EXPECT_EQ(PrefillPositions(0, false), 0);
  EXPECT_EQ(PrefillPositions(1, false), 0);
  EXPECT_EQ(PrefillPositions(5, false), 4);
}

}  // namespace
}  // namespace krause
