#include "server/edge/gate.h"

#include "absl/strings/match.h"
#include "server/edge/status.h"

namespace krause::server {

void Gate::SetTokens(std::vector<std::string> tokens) {
  tokens_ = std::set<std::string, std::less<>>(tokens.begin(), tokens.end());
}
void Gate::SetAdminTokens(std::vector<std::string> tokens) {
  admin_tokens_ = std::set<std::string, std::less<>>(tokens.begin(), tokens.end());
}
void Gate::SetLoaded(bool loaded) { loaded_.store(loaded); }
void Gate::StartDraining() { draining_.store(true); }

absl::Status Gate::Enter(std::optional<std::string_view> authorization, bool admin) {
  if (!tokens_.empty() || (admin && !admin_tokens_.empty())) {
    std::optional<std::string_view> token;
    // The scheme is case-insensitive (RFC 7235); the token is not.
    constexpr std::string_view kBearer = "bearer ";
    if (authorization &&
        absl::StartsWithIgnoreCase(absl::string_view(authorization->data(), authorization->size()),
                                   absl::string_view(kBearer.data(), kBearer.size())))
      token = authorization->substr(kBearer.size());
    const bool is_admin = token && admin_tokens_.count(*token) > 0;
    const bool is_serving = token && tokens_.count(*token) > 0;
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
  std::lock_guard<std::mutex> lock(mu_);
  ++in_flight_;
  return absl::OkStatus();
}

void Gate::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--in_flight_ == 0) idle_.notify_all();
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
