// Three krause-server replicas on loopback behind one client target
// ("ipv4:127.0.0.1:A,127.0.0.1:B,127.0.0.1:C"): the client's round-robin policy spreads calls
// over all three (each replica's own metrics count them), and while one replica drains after a
// shutdown request no idempotent call fails (the retry policy takes its UNAVAILABLE elsewhere).
#include <ATen/ATen.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/http_get.h"
#include "server_fixture.h"

namespace krause::testing {
namespace {

v1::Image Raw(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return server::EncodeRawImage(at::randint(0, 256, {8, 8, 1}, gen, at::kLong).to(at::kByte));
}

double ClassifyCalls(const server::KrauseServer& s, const std::string& code) {
  auto v = client::PrometheusSample(s.metrics().Scrape(), "krause_requests_total",
                                    {{"rpc", "Classify"},
                                     {"protocol", "krause.v1"},
                                     {"model", "vit"},
                                     {"version", "1"},
                                     {"code", code}});
  return v.ok() ? *v : 0.0;  // absent: no such call yet
}

grpc::Status Classify(v1::KrauseService::Stub& stub, uint64_t seed) {
  v1::ClassifyRequest req;
  req.set_model("vit");
  *req.add_images() = Raw(seed);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ClassifyResponse r;
  return stub.Classify(&ctx, req, &r);
}

TEST(Replicas, RoundRobinSpreadsCallsAndADrainingReplicaLosesNoCall) {
  const TinyModels models = WriteTinyModels("replicas");
  std::vector<std::unique_ptr<server::KrauseServer>> servers;
  std::string target = "ipv4:";
  for (int i = 0; i < 3; ++i) {
    server::ServerOptions o = LoopbackOptions(models.manifest);
    o.drain_seconds = 2;
    auto s = server::KrauseServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    target += absl::StrCat(i ? "," : "", "127.0.0.1:", (*s)->port());
    servers.push_back(std::move(*s));
  }
  client::ConnectionOptions c;
  c.server = target;
  c.retry = true;
  auto stub = Stub(c);

  // Round robin: every replica gets calls (the first ones may all reach the replica whose
  // connection was ready first, so call until each has some, at most 300 calls).
  int calls = 0;
  auto all_served = [&] {
    for (const auto& s : servers)
      if (ClassifyCalls(*s, "OK") == 0) return false;
    return true;
  };
  while (calls < 300 && !all_served()) {
    const grpc::Status st = Classify(*stub, calls);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ++calls;
  }
  double total = 0;
  for (const auto& s : servers) {
    EXPECT_GT(ClassifyCalls(*s, "OK"), 0);
    total += ClassifyCalls(*s, "OK");
  }
  EXPECT_EQ(total, calls);
  // Spread, not merely touched: 30 more calls, no replica takes them all.
  std::vector<double> before;
  for (const auto& s : servers) before.push_back(ClassifyCalls(*s, "OK"));
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(Classify(*stub, 1000 + i).ok());
  for (size_t i = 0; i < servers.size(); ++i)
    EXPECT_LT(ClassifyCalls(*servers[i], "OK") - before[i], 30) << "replica " << i;

  // Replica 0 drains while a client keeps calling: every call succeeds somewhere.
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::string first_failure;
  std::thread caller([&] {
    for (uint64_t i = 0; !stop.load(); ++i) {
      const grpc::Status st = Classify(*stub, 2000 + i);
      if (st.ok()) {
        ++ok;
      } else if (failed++ == 0) {
        first_failure = st.error_message();
      }
    }
  });
  // Calls are flowing before the drain.
  while (ok.load() < 20 && failed.load() == 0) std::this_thread::yield();
  servers[0]->Shutdown();  // drains (health NOT_SERVING, new calls UNAVAILABLE), then stops
  const int at_stop = ok.load();
  while (ok.load() < at_stop + 20 && failed.load() == 0) std::this_thread::yield();
  stop = true;
  caller.join();
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_GE(ok.load(), at_stop + 20);
  // After the drain, the two others served every call.
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Classify(*stub, 5000 + i).ok());
}

}  // namespace
}  // namespace krause::testing
