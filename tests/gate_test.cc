// The admission gate (server/edge/gate.h) without a server: token checks, the loading and draining
// refusals in their order, and the in-flight count the drain waits on (no sleeps: WaitIdle is
// asked with deadlines that have already passed); the token file's tenants (server/core/
// tenants.h) and a tenant's limit of calls in flight, which refuses that tenant only.
#include "server/edge/gate.h"

#include <gtest/gtest.h>

#include <chrono>

#include "server/core/errors.h"
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
  gate.SetTenants(*TenantTable::Parse("secret\n  # a comment\n\nother\n", "tokens"));
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

TEST(Tenants, TheTokenFileNamesEachTokensTenantWeightAndLimits) {
  auto t = TenantTable::Parse(
      "tok-a1 tenant=team-a weight=3 max_in_flight=2 max_queued=8\n"
      "tok-a2\ttenant=team-a weight=3\n"  // the same settings again: fine
      "tok-b tenant=team-b max_slots=4 max_priority=2\n"
      "tok-plain\n",
      "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->configured());
  ASSERT_EQ(t->tenants().size(), 3u);
  EXPECT_EQ(t->Find("tok-a1"), 0);
  EXPECT_EQ(t->Find("tok-a2"), 0);
  EXPECT_EQ(t->Find("tok-b"), 1);
  EXPECT_EQ(t->Find("tok-plain"), 2);
  EXPECT_EQ(t->Find("tok-"), -1);
  const TenantSpec& a = *t->tenants()[0];
  EXPECT_EQ(a.name, "team-a");
  EXPECT_EQ(a.weight, 3.0);
  EXPECT_EQ(a.max_in_flight, 2);
  EXPECT_EQ(a.max_queued, 8);
  EXPECT_EQ(a.max_slots, 0);
  EXPECT_EQ(a.max_priority, kDefaultMaxPriority);
  EXPECT_EQ(t->tenants()[1]->max_slots, 4);
  EXPECT_EQ(t->tenants()[1]->max_priority, 2);
  EXPECT_EQ(t->tenants()[2]->name, "default");
  EXPECT_EQ(t->tenants()[2]->weight, 1.0);
  // Each mistake names the file, the line and what would do.
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {
      {"t1 tenant=a weight=2\nt2 tenant=a weight=3\n",
       "tokens:2: tenant a's weight is 3 here but 2 on line 1"},
      {"t1\nt1 tenant=b\n", "tokens:2: the token is already on line 1"},
      {"t1 weight=0\n", "tokens:1: tenant default's weight must be a number in (0, 1000]"},
      {"t1 max_priority=3\n", "max_priority must be an integer in [0, 2], got \"3\""},
      {"t1 colour=red\n", "tokens:1: unknown setting \"colour\""},
      {"t1 team-a\n", "\"team-a\" is not KEY=VALUE"},
      {"t1 tenant=a/b\n", "tenant \"a/b\" is not a name"},
      {"t1 weight=1 weight=2\n", "weight is written twice"},
      {"# only comments\n", "tokens: no tokens"},
  };
  for (const Case& c : cases)
    EXPECT_THAT(TenantTable::Parse(c.text, "tokens").status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.why)))
        << c.text;
}

// A tenant at its max_in_flight is refused (RESOURCE_EXHAUSTED, reason TENANT_LIMIT naming the
// tenant and the limit, with a retry delay); the other tenants are not.
TEST(Gate, ATenantAtItsLimitOfCallsInFlightIsRefusedAlone) {
  Gate gate;
  gate.SetTenants(*TenantTable::Parse("a tenant=team-a max_in_flight=2\nb tenant=team-b\n", "t"));
  gate.SetLoaded(true);
  Share share;
  ASSERT_TRUE(gate.Enter("Bearer a", false, &share).ok());
  EXPECT_EQ(share.tenant, 0);
  EXPECT_EQ(share.name(), "team-a");
  ASSERT_TRUE(gate.Enter("Bearer a").ok());
  Share refused;  // named even when refused at its limit (the request log says whose)
  const absl::Status st = gate.Enter("Bearer a", false, &refused);
  EXPECT_EQ(refused.name(), "team-a");
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kResourceExhausted,
                           HasSubstr("tenant team-a is at its max_in_flight of 2 (2 calls in "
                                     "flight)")));
  const ErrorDetails d = DetailsOf(st);
  EXPECT_EQ(d.reason, "TENANT_LIMIT");
  EXPECT_EQ(d.metadata.at("tenant"), "team-a");
  EXPECT_EQ(d.metadata.at("limit"), "max_in_flight");
  EXPECT_EQ(d.retry_delay, kTenantLimitRetryDelay);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(gate.Enter("Bearer b", false, &share).ok());
  EXPECT_EQ(share.name(), "team-b");
  EXPECT_EQ(gate.in_flight(0), 2);
  EXPECT_EQ(gate.in_flight(1), 5);
  gate.Leave(0);  // one of team-a's left: its next call enters
  EXPECT_TRUE(gate.Enter("Bearer a").ok());
  EXPECT_EQ(gate.in_flight(), 7);
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
