#include "server/core/scheduling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "server/core/errors.h"

namespace krause::server {

bool RunOnArrival(const ClassifyArrival& a) {
  return a.caller_may_run && a.queue_empty && !a.batch_running && !a.stopping &&
         a.max_queue_delay == Clock::duration::zero() && a.images >= 1 &&
         a.images <= a.max_batch_size && a.flops <= kMaxArrivalFlops;
}

ClassifyPlan PlanClassifyBatch(const std::vector<QueuedClassify>& queue, Clock::time_point now,
                               const ClassifyPlanOptions& options, bool stopping,
                               const FairClock& clock) {
  ClassifyPlan plan;
  plan.clock = clock;
  std::vector<size_t> live;
  for (size_t i = 0; i < queue.size(); ++i) {
    const QueuedClassify& q = queue[i];
    if (stopping) {
      plan.drop.push_back({i, Refusal("the server is shutting down", reason::kDraining)});
    } else if (now >= q.deadline) {
      plan.drop.push_back(
          {i, absl::DeadlineExceededError("deadline exceeded while queued for a batch")});
    } else if (q.cancelled) {
      plan.drop.push_back({i, absl::CancelledError("cancelled by the client")});
    } else {
      live.push_back(i);
    }
  }
  if (live.empty()) return plan;
  int64_t images = 0;
  for (size_t i : live) images += queue[i].images;
  const Clock::time_point oldest = queue[live.front()].enqueued;
  const Clock::time_point due = options.max_queue_delay <= Clock::duration::zero()
                                    ? oldest
                                    : oldest + options.max_queue_delay;
  if (images >= options.max_batch_size || now >= due) {
    // Whole requests in the fair order up to max_batch_size images (at least one request): the
    // first that does not fit ends the batch (no overtaking it).
    FairClock& c = plan.clock;
    // Within a tenant: highest priority first, then oldest (the queue is in arrival order).
    std::stable_sort(live.begin(), live.end(), [&](size_t a, size_t b) {
      return queue[a].tenant != queue[b].tenant ? queue[a].tenant < queue[b].tenant
                                                : queue[a].priority > queue[b].priority;
    });
    std::vector<size_t> heads;  // per tenant with requests left: its position in `live`
    for (size_t k = 0; k < live.size(); ++k)
      if (k == 0 || queue[live[k]].tenant != queue[live[k - 1]].tenant) heads.push_back(k);
    int64_t taken = 0;
    while (!heads.empty()) {
      size_t best = 0;
      double best_start = 0;
      for (size_t h = 0; h < heads.size(); ++h) {
        const QueuedClassify& q = queue[live[heads[h]]];
        const double start = std::max(c.Of(q.tenant), c.last);
        const QueuedClassify& b = queue[live[heads[best]]];
        if (h == 0 || start < best_start || (start == best_start && q.enqueued < b.enqueued)) {
          best = h;
          best_start = start;
        }
      }
      const size_t i = live[heads[best]];
      const QueuedClassify& q = queue[i];
      if (!plan.take.empty() && taken + q.images > options.max_batch_size) break;
      plan.take.push_back(i);
      plan.start.push_back(best_start);
      taken += q.images;
      c.Charge(q.tenant, best_start, q.images, q.weight);
      c.last = best_start;
      // The tenant's next request, or the tenant is done.
      const size_t next = heads[best] + 1;
      if (next < live.size() && queue[live[next]].tenant == q.tenant) {
        heads[best] = next;
      } else {
        heads.erase(heads.begin() + static_cast<std::ptrdiff_t>(best));
      }
    }
    return plan;
  }
  // Wait for company until the batch is due; a deadline in between is noticed then.
  plan.wake_at = due;
  for (size_t i : live) plan.wake_at = std::min(plan.wake_at, queue[i].deadline);
  return plan;
}

ClassifyPlan PlanClassifyCutIn(const std::vector<QueuedClassify>& queue, Clock::time_point now,
                               double virtual_now, int64_t max_images, const FairClock& clock,
                               const std::vector<char>& batch_tenants) {
  ClassifyPlan plan;
  plan.clock = clock;
  FairClock& c = plan.clock;
  // Each tenant's head: its live request of the highest priority, the oldest of those.
  std::map<int32_t, size_t> head;
  for (size_t i = 0; i < queue.size(); ++i) {
    const QueuedClassify& q = queue[i];
    if (now >= q.deadline || q.cancelled) continue;
    const auto it = head.find(q.tenant);
    if (it == head.end() || q.priority > queue[it->second].priority) head[q.tenant] = i;
  }
  // Tenants not past the batch, the least virtual time first (ties: the older head).
  std::vector<size_t> order;
  for (const auto& [tenant, i] : head)
    if (c.Of(tenant) <= virtual_now && (static_cast<size_t>(tenant) >= batch_tenants.size() ||
                                       !batch_tenants[static_cast<size_t>(tenant)]))
      order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const double va = c.Of(queue[a].tenant), vb = c.Of(queue[b].tenant);
    return va != vb ? va < vb : queue[a].enqueued < queue[b].enqueued;
  });
  int64_t taken = 0;
  for (size_t i : order) {
    const QueuedClassify& q = queue[i];
    if (taken + q.images > max_images) break;
    plan.take.push_back(i);
    plan.start.push_back(virtual_now);
    taken += q.images;
    c.Charge(q.tenant, virtual_now, q.images, q.weight);
  }
  return plan;
}

SidePlan PlanSideWork(const std::vector<QueuedSide>& side, Clock::time_point now, bool batch_due,
                      bool last_was_side, bool stopping) {
  SidePlan plan;
  bool found = false;
  for (size_t i = 0; i < side.size(); ++i) {
    if (stopping) {
      plan.drop.push_back({i, Refusal("the server is shutting down", reason::kDraining)});
    } else if (now >= side[i].deadline) {
      plan.drop.push_back({i, absl::DeadlineExceededError("deadline exceeded while queued")});
    } else if (side[i].cancelled) {
      plan.drop.push_back({i, absl::CancelledError("cancelled by the client")});
    } else if (!found) {
      found = true;
      plan.index = i;
    }
  }
  plan.run = found && (!batch_due || !last_was_side);
  return plan;
}

SideWorkCredit::SideWorkCredit(const GeneratorSchedulingOptions& o)
    : ratio_(o.side_share >= 1.0 ? std::numeric_limits<double>::infinity()
                                 : o.side_share / (1.0 - o.side_share)),
      cap_(o.side_slice_seconds),
      credit_(o.side_slice_seconds) {}

void SideWorkCredit::OnDecode(double seconds) {
  credit_ = std::isinf(ratio_) ? cap_ : std::min(cap_, credit_ + seconds * ratio_);
}

void SideWorkCredit::OnSideWork(double seconds) { credit_ -= seconds; }

WorkerPlan PlanWorkerIteration(const WorkerState& s, const GeneratorSchedulingOptions& o) {
  WorkerPlan plan;
  const bool idle = s.decoding == 0;
  if (idle || s.credit_seconds > 0) {
    // Idle, a slice at a time (so that the first admitted streams start decoding soon);
    // else what the credit allows.
    const double budget =
        idle ? std::max(o.side_slice_seconds, s.credit_seconds) : s.credit_seconds;
    // Admissions first (they start streams).
    AdmissionBudget a;
    a.free_slots = s.free_slots;
    a.seconds = budget;
    a.seconds_per_token = s.seconds_per_prefill_token;
    a.held = s.held;
    a.expected = s.expected;
    plan.admission = PlanAdmission(s.waiting, a);
    const double spent = plan.admission.seconds;
    if (s.score_images_left > 0 && spent < budget) {
      // One chunk of what is left of the budget; while its cost is unknown, one image (which
      // measures it).
      int64_t images = 1;
      if (s.seconds_per_score_image > 0) {
        images = static_cast<int64_t>(std::floor((budget - spent) / s.seconds_per_score_image));
      }
      plan.score_images = std::clamp<int64_t>(images, 1, s.score_images_left);
    }
  }
  plan.step = s.decoding > 0 || !plan.admission.ids.empty();
  return plan;
}

namespace {
double Smooth(double old, double now) { return old == 0 ? now : 0.7 * old + 0.3 * now; }
}  // namespace

void WorkerLedger::OnScore(double seconds, int64_t images, bool decoding) {
  seconds_per_score_image_ =
      Smooth(seconds_per_score_image_, seconds / static_cast<double>(images));
  if (decoding) credit_.OnSideWork(seconds);
}

void WorkerLedger::OnStep(int64_t prefill_tokens, double prefill_seconds, double decode_seconds,
                          bool decoding) {
  credit_.OnDecode(decode_seconds);
  if (prefill_tokens > 0) {
    if (decoding) credit_.OnSideWork(prefill_seconds);
    seconds_per_prefill_token_ =
        Smooth(seconds_per_prefill_token_, prefill_seconds / static_cast<double>(prefill_tokens));
  }
}

void WorkerLedger::OnDone(const FairShare& share, Clock::time_point now) {
  done_[share.group] = {share, now};
}

void WorkerLedger::Fill(WorkerState* s, Clock::time_point now) const {
  s->expected.clear();
  for (const auto& [tenant, last] : done_) {
    if (now - last.second <= window_) s->expected.push_back(last.first);
  }
  s->credit_seconds = credit_.seconds();
  s->seconds_per_prefill_token = seconds_per_prefill_token_;
  s->seconds_per_score_image = seconds_per_score_image_;
}

}  // namespace krause::server
