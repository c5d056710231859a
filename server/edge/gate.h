// Admission for every call: authentication (bearer tokens), refusal while the models load or the
// server drains, and the count of calls in flight that the drain waits on. Plain values in and
// out (the caller reads the "authorization" metadata), so it is tested without a server.
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

namespace krause::server {

class Gate {
 public:
  void SetTokens(std::vector<std::string> tokens);  // empty: no authentication
  // Tokens model control needs (they pass for serving calls too).
  void SetAdminTokens(std::vector<std::string> tokens);
  void SetLoaded(bool loaded);  // false while the models load
  void StartDraining();

  // `authorization`: the call's "authorization" metadata, if it sent one. OK and the call counts
  // as in flight (Leave() must follow), or why it may not run: UNAUTHENTICATED without a known
  // "Bearer <token>" (the scheme in any case) when tokens are set, then UNAVAILABLE while
  // draining or loading. An `admin` call (model control), when either list is set, needs an
  // admin token: PERMISSION_DENIED for a serving token.
  absl::Status Enter(std::optional<std::string_view> authorization, bool admin = false);
  void Leave();
  // Waits until no call is in flight or `deadline`; true when idle.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline) const;
  int64_t in_flight() const;
  bool loaded() const { return loaded_.load(); }
  bool draining() const { return draining_.load(); }

 private:
  std::set<std::string, std::less<>> tokens_, admin_tokens_;
  std::atomic<bool> loaded_{false};
  std::atomic<bool> draining_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable idle_;
  int64_t in_flight_ = 0;
};

}  // namespace krause::server
