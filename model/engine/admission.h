// Which waiting generation requests get their cache slots now: the decode engine's one admission
// rule, as a pure function. DecodeEngine::Step carries a plan out (Step() without a plan makes
// one with no time budget); the server's generator worker plans with a prefill budget inside
// PlanWorkerIteration (server/core/scheduling.h) and hands that plan to Step. Nothing else decides
// or restates who is admitted.
//
// The rule:
//   - oldest first; a request takes all its slots (2 when guided, else 1) or waits, and every
//     request behind it waits too: no overtaking, so a guided request is never starved by a
//     stream of unguided ones;
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

// A request waiting for cache slots, as admission planning sees it (DecodeEngine::Waiting()).
struct WaitingRequest {
  int64_t id = 0;
  int64_t slots = 1;           // cache slots it takes: 2 when guided, else 1
  int64_t prefill_tokens = 0;  // positions its prefill runs, over all its slots
};

struct AdmissionBudget {
  int64_t free_slots = 0;
  // Prefill time the admissions may take, estimated with seconds_per_token (the measured cost of
  // one prefill position; 0 while unknown). Infinite: no limit, every request that fits is taken.
  double seconds = std::numeric_limits<double>::infinity();
  double seconds_per_token = 0;
};

struct AdmissionPlan {
  std::vector<int64_t> ids;  // the requests to admit, oldest first
  int64_t slots = 0;         // the cache slots they take
  double seconds = 0;        // their estimated prefill time (0 where the cost is unknown)
};

// `waiting`: oldest first.
AdmissionPlan PlanAdmission(const std::vector<WaitingRequest>& waiting,
                            const AdmissionBudget& budget);

// The positions a request's prefill runs on one slot: every known model input but the last (the
// decode step feeds that one). With a start token the inputs are [START, prompt...]; without one
// they are the prompt (an empty prompt starts from a drawn x_0, and nothing is prefilled).
int64_t PrefillPositions(int64_t prompt_length, bool start_token);

}  // namespace krause
