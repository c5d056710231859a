#include "server/edge/gate.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/edge/status.h"

namespace krause::server {

void Gate::SetTenants(TenantTable tenants) {
  std::lock_guard<std::mutex> lock(mu_);
  tenants_ = std::move(tenants);
  tenant_in_flight_.assign(tenants_.tenants().size(), 0);
}
void Gate::SetAdminTokens(std::vector<std::string> tokens) {
  admin_tokens_ = std::set<std::string, std::less<>>(tokens.begin(), tokens.end());
}
void Gate::SetLoaded(bool loaded) { loaded_.store(loaded); }
void Gate::StartDraining() { draining_.store(true); }

absl::Status Gate::Enter(std::optional<std::string_view> authorization, bool admin, Share* share) {
  int32_t tenant = 0;
  if (tenants_.has_tokens() || (admin && !admin_tokens_.empty())) {
    std::optional<std::string_view> token;
    // The scheme is case-insensitive (RFC 7235); the token is not.
    constexpr std::string_view kBearer = "bearer ";
    if (authorization &&
        absl::StartsWithIgnoreCase(absl::string_view(authorization->data(), authorization->size()),
                                   absl::string_view(kBearer.data(), kBearer.size())))
      token = authorization->substr(kBearer.size());
    const bool is_admin = token && admin_tokens_.count(*token) > 0;
    const int32_t serving =
        token ? tenants_.Find(absl::string_view(token->data(), token->size())) : -1;
    const bool is_serving = serving >= 0;
    if (is_serving && !admin) tenant = serving;
    if (admin && !is_admin && is_serving)
      return absl::PermissionDeniedError(
          admin_tokens_.empty()
              ? "model control needs an admin token, and this server has none (--admin_tokens)"
              : "model control needs a token of --admin_tokens; this is a serving token");
    if (!(admin ? is_admin : is_admin || is_serving))
      return absl::UnauthenticatedError(
          "missing or invalid token: send \"authorization: Bearer <token>\" (gRPC metadata or an "
          "HTTP header)");
  }
  if (draining_.load()) return Refusal("the server is shutting down", reason::kDraining);
  if (!loaded_.load()) return Refusal("the models are still loading", reason::kModelLoading);
  const std::shared_ptr<const TenantSpec>& spec = tenants_.tenants()[static_cast<size_t>(tenant)];
  if (share != nullptr) {
    share->tenant = tenant;
    share->spec = spec;
  }
  std::lock_guard<std::mutex> lock(mu_);
  int64_t& mine = tenant_in_flight_[static_cast<size_t>(tenant)];
  if (spec->max_in_flight > 0 && mine >= spec->max_in_flight)
    return TenantRefusal(*spec, "max_in_flight", spec->max_in_flight,
                         absl::StrCat(mine, " calls in flight"));
  ++mine;
  ++in_flight_;
  return absl::OkStatus();
}

void Gate::Leave(int32_t tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  --tenant_in_flight_[static_cast<size_t>(tenant)];
  if (--in_flight_ == 0) idle_.notify_all();
}

int64_t Gate::in_flight(int32_t tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tenant_in_flight_[static_cast<size_t>(tenant)];
}

bool Gate::WaitIdle(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_until(lock, deadline, [&] { return in_flight_ == 0; });
}

int64_t Gate::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

}  // namespace krause::server
