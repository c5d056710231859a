#include "model/engine/admission.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace krause {

namespace {

// One group's waiting requests in the order the group takes them: priority, then age.
struct GroupQueue {
  std::vector<const WaitingRequest*> queue;
  size_t next = 0;
  int64_t held = 0;  // slots held, this plan's admissions included
  double weight = 1;
  const WaitingRequest* head() const { return next < queue.size() ? queue[next] : nullptr; }
};

}  // namespace

AdmissionPlan PlanAdmission(const std::vector<WaitingRequest>& waiting,
                            const AdmissionBudget& budget) {
  AdmissionPlan plan;
  const bool limited = std::isfinite(budget.seconds);
  std::map<int32_t, GroupQueue> groups;
  for (const WaitingRequest& w : waiting) {
    GroupQueue& g = groups[w.share.group];
    g.queue.push_back(&w);
    g.weight = w.share.weight;
  }
  for (auto& [group, g] : groups) {
    std::stable_sort(g.queue.begin(), g.queue.end(),
                     [](const WaitingRequest* a, const WaitingRequest* b) {
                       return a->share.priority > b->share.priority;
                     });
  }
  // Every group's weight once (holding, waiting or expected), the slots in all, and the slots
  // kept for the expected groups: up to each one's weighted share.
  std::map<int32_t, double> weights;
  int64_t total = budget.free_slots;
  for (const GroupSlots& h : budget.held) {
    weights[h.share.group] = h.share.weight;
    total += h.slots;
    if (auto it = groups.find(h.share.group); it != groups.end()) it->second.held = h.slots;
  }
  for (const auto& [group, g] : groups) weights[group] = g.weight;
  for (const FairShare& e : budget.expected) weights.emplace(e.group, e.weight);
  double weight_sum = 0;  // > 0 once a request waits (nothing is picked before)
  for (const auto& [group, w] : weights) weight_sum += w;
  const auto fair_slots = [&](double weight) {
    return static_cast<double>(total) * weight / weight_sum;
  };
  // An expected group's waiting requests take their turn by the rule; what is kept is the rest of
  // its share, for the calls still on their way.
  int64_t kept = 0;
  for (const FairShare& e : budget.expected) {
    int64_t has = 0;  // slots held and asked for
    for (const GroupSlots& h : budget.held) has += h.share.group == e.group ? h.slots : 0;
    if (auto it = groups.find(e.group); it != groups.end())
      for (const WaitingRequest* w : it->second.queue) has += w->slots;
    kept += std::max<int64_t>(0, static_cast<int64_t>(std::floor(fair_slots(e.weight))) - has);
  }
  for (;;) {
    // The group furthest below its weighted share whose head may still take its slots.
    GroupQueue* pick = nullptr;
    double pick_use = 0;
    for (auto& [group, g] : groups) {
      const WaitingRequest* h = g.head();
      if (h == nullptr) continue;
      if (h->share.max_slots > 0 && g.held + h->slots > h->share.max_slots) continue;
      const double use = static_cast<double>(g.held) / std::max(g.weight, 1e-9);
      if (pick == nullptr || use < pick_use || (use == pick_use && h->id < pick->head()->id)) {
        pick = &g;
        pick_use = use;
      }
    }
    if (pick == nullptr) break;
    const WaitingRequest& w = *pick->head();
    if (w.slots > budget.free_slots - plan.slots) break;  // it waits, and everyone after it
    // Past its share it may not take the slots kept for the expected groups.
    if (static_cast<double>(pick->held + w.slots) > fair_slots(pick->weight) &&
        w.slots > budget.free_slots - plan.slots - kept)
      break;
    const double cost = static_cast<double>(w.prefill_tokens) * budget.seconds_per_token;
    if (!plan.ids.empty() && plan.seconds + cost > budget.seconds) break;
    plan.ids.push_back(w.id);
    plan.slots += w.slots;
    plan.seconds += cost;
    pick->held += w.slots;
    ++pick->next;
    if (limited && w.prefill_tokens > 0 && budget.seconds_per_token <= 0) break;  // measures it
  }
  return plan;
}

int64_t PrefillPositions(int64_t prompt_length, bool start_token) {
  return start_token ? prompt_length : std::max<int64_t>(0, prompt_length - 1);
}

}  // namespace krause
