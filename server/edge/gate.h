// Admission for every call: authentication (bearer tokens) and the call's tenant (tenants.h),
// the tenant's limit of calls in flight, refusal while the models load or the server drains, and
// the count of calls in flight that the drain waits on. Plain values in and out (the caller reads
// the "authorization" metadata), so it is tested without a server.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "server/core/tenants.h"

namespace krause::server {

class Gate {
 public:
  // The serving tokens and their tenants (a table without tokens: no authentication).
  void SetTenants(TenantTable tenants);
  // Tokens model control needs (they pass for serving calls too).
  void SetAdminTokens(std::vector<std::string> tokens);
  void SetLoaded(bool loaded);  // false while the models load
  void StartDraining();

  // `authorization`: the call's "authorization" metadata, if it sent one. OK and the call counts
  // as in flight (Leave() must follow), or why it may not run: UNAUTHENTICATED without a known
  // "Bearer <token>" (the scheme in any case) when tokens are set, then UNAVAILABLE while
  // draining or loading, then RESOURCE_EXHAUSTED (reason TENANT_LIMIT, with a retry delay) when
  // the tenant has max_in_flight calls in flight. The call's tenant goes in `share` (optional)
  // once it passed the token, draining and loading checks, so a call refused at its tenant's
  // limit has it too. An `admin` call (model control), when either list is set, needs an admin
  // token: PERMISSION_DENIED for a serving token; it counts as the default tenant's.
  absl::Status Enter(std::optional<std::string_view> authorization, bool admin = false,
                     Share* share = nullptr);
  void Leave(int32_t tenant = 0);
  const TenantTable& tenants() const { return tenants_; }
  // Calls in flight of one tenant.
  int64_t in_flight(int32_t tenant) const;
  // Waits until no call is in flight or `deadline`; true when idle.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline) const;
  int64_t in_flight() const;
  bool loaded() const { return loaded_.load(); }
  bool draining() const { return draining_.load(); }

 private:
  TenantTable tenants_;
  std::set<std::string, std::less<>> admin_tokens_;
  std::atomic<bool> loaded_{false};
  std::atomic<bool> draining_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable idle_;
  int64_t in_flight_ = 0;
  std::vector<int64_t> tenant_in_flight_ = std::vector<int64_t>(1, 0);
};

}  // namespace krause::server
