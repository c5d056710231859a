// Tenants: who a call is served for. Each bearer token of --auth_tokens belongs to a named tenant
// with a weight (its share of a saturated model, against the other tenants with work waiting)
// and optional limits (calls in flight, calls queued for one model, generation cache slots of one
// model, the highest priority its calls may ask for). Without tokens every call is the one
// tenant "default". The token file, one token per line ('#' comments):
//
//   TOKEN [tenant=NAME] [weight=W] [max_in_flight=N] [max_queued=N] [max_slots=N]
//         [max_priority=P]
//
// A token without tenant= belongs to "default". A tenant's settings may be written on any of its
// tokens' lines, but written twice they must agree.
// Thread-safety: TenantTable is immutable once read; Share is a plain value.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace krause::server {

// Priorities a call may ask for (krause.v1's `priority`, the Open Inference Protocol's parameter,
// the HTTP generation's setting): higher runs sooner within its tenant's share. The highest is
// reserved to tenants whose max_priority allows it.
inline constexpr int kDefaultPriority = 0;
inline constexpr int kMaxPriority = 2;
inline constexpr int kDefaultMaxPriority = 1;
inline constexpr double kMaxTenantWeight = 1000;

struct TenantSpec {
  std::string name = "default";
  double weight = 1;          // in (0, kMaxTenantWeight]
  int64_t max_in_flight = 0;  // calls at once (0: no limit)
  int64_t max_queued = 0;     // calls waiting in one model's queue (0: no limit)
  int64_t max_slots = 0;      // cache slots held in one generator (0: no limit)
  int max_priority = kDefaultMaxPriority;
};

// A call's tenant as the schedulers see it: its index (stable for the server's life), its spec,
// and the priority the call asked for.
struct Share {
  int32_t tenant = 0;
  std::shared_ptr<const TenantSpec> spec;  // null: the default tenant, no limits
  int priority = kDefaultPriority;
  double weight() const { return spec ? spec->weight : 1.0; }
  const std::string& name() const;
};

// RESOURCE_EXHAUSTED for a tenant at one of its limits: reason TENANT_LIMIT with metadata
// "tenant" and "limit" (the setting's name), a retry delay, and a message naming both and what
// the tenant holds now (`now`: "64 calls in flight").
absl::Status TenantRefusal(const TenantSpec& tenant, absl::string_view limit, int64_t value,
                           absl::string_view now);

// A call's priority (`field`: its wire name) for `share`'s tenant: INVALID_ARGUMENT naming the
// field outside [0, kMaxPriority]; PERMISSION_DENIED naming it and the tenant's max_priority
// above that (kDefaultMaxPriority without a spec).
absl::Status CheckPriority(const Share& share, int64_t priority, absl::string_view field);

class TenantTable {
 public:
  // The token file's text; `source` names it in errors ("FILE:LINE: ...").
  static absl::StatusOr<TenantTable> Parse(absl::string_view text, const std::string& source);
  // One tenant, "default", and no tokens.
  TenantTable();

  // The tenant of `token`, or -1.
  int32_t Find(absl::string_view token) const;
  const std::vector<std::shared_ptr<const TenantSpec>>& tenants() const { return tenants_; }
  bool has_tokens() const { return !tokens_.empty(); }
  // Configured: read from a token file, so the tenants' names are bounded (metric labels).
  bool configured() const { return configured_; }

 private:
  std::vector<std::shared_ptr<const TenantSpec>> tenants_;
  std::vector<std::pair<std::string, int32_t>> tokens_;  // sorted by token
  bool configured_ = false;
};

}  // namespace krause::server
