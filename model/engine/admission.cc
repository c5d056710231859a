#include "model/engine/admission.h"

#include <algorithm>
#include <cmath>

namespace krause {

AdmissionPlan PlanAdmission(const std::vector<WaitingRequest>& waiting,
                            const AdmissionBudget& budget) {
  AdmissionPlan plan;
  const bool limited = std::isfinite(budget.seconds);
  for (const WaitingRequest& w : waiting) {
    if (w.slots > budget.free_slots - plan.slots) break;  // it waits, and everyone behind it
    const double cost = static_cast<double>(w.prefill_tokens) * budget.seconds_per_token;
    if (!plan.ids.empty() && plan.seconds + cost > budget.seconds) break;
    plan.ids.push_back(w.id);
    plan.slots += w.slots;
    plan.seconds += cost;
    if (limited && w.prefill_tokens > 0 && budget.seconds_per_token <= 0) break;  // measures it
  }
  return plan;
}

int64_t PrefillPositions(int64_t prompt_length, bool start_token) {
  return start_token ? prompt_length : std::max<int64_t>(0, prompt_length - 1);
}

}  // namespace krause
