// PlanAdmission (model/engine/admission.h), the decode engine's one admission rule, case by case
// with exact outcomes: oldest first, a guided request's two slots (and the requests behind it
// waiting), the free slots, the prefill budget, the first admission whatever its cost, a prefill
// of unknown cost ending the plan, and PrefillPositions.
#include "model/engine/admission.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace krause {
namespace {

using Ids = std::vector<int64_t>;

WaitingRequest W(int64_t id, int64_t slots, int64_t tokens) { return {id, slots, tokens}; }

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
