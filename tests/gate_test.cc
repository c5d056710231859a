// The admission gate (server/edge/gate.h) without a server: token checks, the loading and draining
// refusals in their order, and the in-flight count the drain waits on (no sleeps: WaitIdle is
// asked with deadlines that have already passed).
#include "server/edge/gate.h"

#include <gtest/gtest.h>

#include <chrono>

#include "server/core/registry.h"
#include "tests/test_util.h"

namespace krause::server {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

TEST(Gate, RefusesWhileLoadingThenCountsCallsInFlight) {
  Gate gate;
  EXPECT_THAT(gate.Enter(std::nullopt),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("still loading")));
  EXPECT_EQ(gate.in_flight(), 0);
  gate.SetLoaded(true);
  ASSERT_TRUE(gate.Enter(std::nullopt).ok());
  ASSERT_TRUE(gate.Enter("Bearer ignored without tokens").ok());
  EXPECT_EQ(gate.in_flight(), 2);
  EXPECT_FALSE(gate.WaitIdle(Clock::now()));  // two in flight: not idle by a past deadline
  gate.Leave();
  EXPECT_FALSE(gate.WaitIdle(Clock::now() - std::chrono::seconds(1)));
  gate.Leave();
  EXPECT_EQ(gate.in_flight(), 0);
  EXPECT_TRUE(gate.WaitIdle(Clock::now() - std::chrono::seconds(1)));
}

TEST(Gate, TokensAreCheckedBeforeAnythingElse) {
  Gate gate;
  gate.SetTokens({"secret", "other"});
  // Unauthenticated comes first, even while loading.
  EXPECT_THAT(gate.Enter(std::nullopt),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("authorization: Bearer")));
  EXPECT_THAT(gate.Enter("Bearer secret"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("still loading")));
  gate.SetLoaded(true);
  for (const char* good : {"Bearer secret", "bearer secret", "BEARER other"}) {
    EXPECT_TRUE(gate.Enter(good).ok()) << good;
  }
  EXPECT_EQ(gate.in_flight(), 3);
  for (const char* bad : {"secret", "Bearer Secret", "Bearer secret ", "Basic secret", "Bearer ",
                          "Bearersecret", ""}) {
    EXPECT_THAT(gate.Enter(bad), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("token")))
        << "\"" << bad << "\"";
  }
  EXPECT_EQ(gate.in_flight(), 3);  // refused calls are not counted
}

TEST(Gate, DrainingRefusesNewCallsAndLetsTheOthersLeave) {
  Gate gate;
  gate.SetLoaded(true);
  ASSERT_TRUE(gate.Enter(std::nullopt).ok());
  gate.StartDraining();
  EXPECT_TRUE(gate.draining());
  EXPECT_THAT(gate.Enter(std::nullopt),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  EXPECT_EQ(gate.in_flight(), 1);
  gate.Leave();
  EXPECT_TRUE(gate.WaitIdle(Clock::now()));
}

}  // namespace
}  // namespace krause::server
