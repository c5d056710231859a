// Which waiting generation requests get their cache slots now: the decode engine's one admission
// rule, as a pure function. DecodeEngine::Step carries a plan out (Step() without a plan makes
// one with no time budget); the server's generator worker plans with a prefill budget inside
// PlanWorkerIteration (server/core/scheduling.h) and hands that plan to Step. Nothing else decides
// or restates who is admitted.
//
// The rule:
//   - shares first: each request belongs to a share group (a tenant, with a weight and an
//     optional limit on the slots it holds). The next request considered is the head of the
//     group whose slots held, counting this plan's admissions, divided by its weight are least
//     (ties: the group whose head is oldest); a group at its slot limit is passed over. Within a
//     group the head is its highest-priority request, the oldest of those. So a group's share of
//     a full engine follows its weight, not the number of requests it keeps waiting, and with
//     one group (no tenants) this is oldest first within priority;
//   - a group's weighted share is the slots (free and held) times its weight over the weights of
//     the groups holding, waiting or expected back (AdmissionBudget::expected); for an expected
//     group the slots of its share it neither holds nor asks for are kept, and a group past its
//     share is not admitted into them. Without that,
//     images that finish together would free their slots for whoever else is waiting, a moment
//     before their own clients' next calls arrive, and the shares would follow who resubmits
//     first;
//   - a request takes all its slots (2 when guided, else 1) or waits, and the plan ends there:
//     nobody is admitted past it, so a guided request is never starved by a stream of unguided
//     ones;
//   - with a finite budget, admissions stop before the prefill estimate would pass it, but the
//     first request that fits the slots is always admitted (waiting work always progresses), and a
//     prefill whose cost was never measured is the plan's last (running it measures the cost).
//
// It lives in the engine layer because the engine plans for itself when it runs alone (tools,
// benchmarks, tests), and model/ cannot see server/.
// Thread-safety: a pure function and value types.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace krause {

// Whose a request is, as admission shares slots: its group (a tenant's index, 0.. a few
// hundred), the group's weight and slot limit (the same on every request of a group), and the
// request's priority within its group (higher first).
struct FairShare {
  int32_t group = 0;
  double weight = 1;      // > 0
  int64_t max_slots = 0;  // slots the group may hold at once (0: no limit)
  int priority = 0;
};

// The slots one group holds (DecodeEngine::HeldSlots()).
struct GroupSlots {
  FairShare share;  // the group and its weight (priority: unused)
  int64_t slots = 0;
};

// A request waiting for cache slots, as admission planning sees it (DecodeEngine::Waiting()).
struct WaitingRequest {
  int64_t id = 0;
  int64_t slots = 1;           // cache slots it takes: 2 when guided, else 1
  int64_t prefill_tokens = 0;  // positions its prefill runs, over all its slots
  FairShare share;
};

struct AdmissionBudget {
  int64_t free_slots = 0;
  // Prefill time the admissions may take, estimated with seconds_per_token (the measured cost of
  // one prefill position; 0 while unknown). Infinite: no limit, every request that fits is taken.
  double seconds = std::numeric_limits<double>::infinity();
  double seconds_per_token = 0;
  // The groups holding slots now, with how many (a group not listed holds none).
  std::vector<GroupSlots> held;
  // Groups expected back at once (their images just finished: their clients' next calls are on
  // the way). The part of such a group's weighted share it neither holds nor asks for is kept
  // for it: a group over its own share is not admitted into those slots.
  std::vector<FairShare> expected;
};

struct AdmissionPlan {
  std::vector<int64_t> ids;  // the requests to admit, in the order the rule took them
  int64_t slots = 0;         // the cache slots they take
  double seconds = 0;        // their estimated prefill time (0 where the cost is unknown)
};

// `waiting`: oldest first (ids grow with age).
AdmissionPlan PlanAdmission(const std::vector<WaitingRequest>& waiting,
                            const AdmissionBudget& budget);

// The positions a request's prefill runs on one slot: every known model input but the last (the
// decode step feeds that one). With a start token the inputs are [START, prompt...]; without one
// they are the prompt (an empty prompt starts from a drawn x_0, and nothing is prefilled).
int64_t PrefillPositions(int64_t prompt_length, bool start_token);

}  // namespace krause
