// End-to-end tests of krause-server's shutdown (in process, on loopback ports; server_test.h):
// streams cancelled after the grace or finishing within it, and the resuming client continuing a
// stream on another replica when the one serving it drains.
#include <ATen/ATen.h>

#include <chrono>
#include <string>
#include <thread>

#include "client/resume.h"
#include "model/attention/cpu_kernels.h"
#include "server_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

TEST_F(ServerTest, ShutdownCancelsStreamsAfterTheGrace) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.drain_seconds = 0.3;
  StartServer(o, {}, milliseconds(5));  // the stream takes >= 768 * 5 ms
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_model("karm-big");
  req.set_temperature(1);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  // The first message says what a resume needs: the model version, the seed, the shape.
  ASSERT_TRUE(m.has_start());
  EXPECT_EQ(m.start().model(), "karm-big");
  EXPECT_EQ(m.start().model_version(), "1");
  EXPECT_EQ(m.start().height(), 16u);
  EXPECT_EQ(m.start().width(), 16u);
  EXPECT_EQ(m.start().channels(), 3u);
  // ... and what decides the bits (a resumed attempt must come from a replica that says the same).
  EXPECT_EQ(m.start().numerics(),
            absl::StrCat("fp32 fused_cpu on cpu, ", cpu::CpuKernelFamily(cpu::CpuKernels().name),
                         " kernel family, float32 weights, float32 cache"));
  std::thread stopper([&] { server_->Shutdown(); });
  // Draining: health says NOT_SERVING and new calls are refused.
  EXPECT_TRUE(Eventually([&] { return server_->gate().draining(); }));
  {
    auto ch = client::MakeChannel(conn_);
    auto health = grpc::health::v1::Health::NewStub(*ch);
    grpc::ClientContext hc;
    grpc::health::v1::HealthCheckResponse hr;
    const grpc::Status st = health->Check(&hc, {}, &hr);
    EXPECT_TRUE(!st.ok() || hr.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    grpc::ClientContext lc;
    v1::ListModelsResponse lr;
    const grpc::Status refused = stub_->ListModels(&lc, {}, &lr);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(server::DetailsOf(refused).reason, "DRAINING");
    EXPECT_EQ(server::DetailsOf(refused).retry_delay, std::chrono::milliseconds(0));
    // ... and as gRPC's retry pushback, which the clients' retry policy honours.
    const auto& trailers = lc.GetServerTrailingMetadata();
    const auto pushback = trailers.find("grpc-retry-pushback-ms");
    ASSERT_NE(pushback, trailers.end());
    EXPECT_EQ(std::string(pushback->second.data(), pushback->second.size()), "0");
  }
  bool later_start = false;
  while (reader->Read(&m)) later_start = later_start || m.has_start();
  EXPECT_FALSE(later_start) << "only the first message carries the start";
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("shutting down"));
  // The stream's end says DRAINING (retry elsewhere at once), with the model.
  EXPECT_EQ(server::DetailsOf(st).reason, "DRAINING");
  EXPECT_EQ(server::DetailsOf(st).metadata.at("model"), "karm-big");
  stopper.join();
}

// The resuming client (client/resume.h) in process, two replicas behind one target: the replica
// serving the stream drains (0.05 s grace) after rows have arrived; the stream continues on the
// other from the rows received and ends with the image an undisturbed call gives. (chaos_test
// does this with processes and kill -9; here it also runs under TSan.)
TEST_F(ServerTest, ResumingClientContinuesAStreamOnAnotherReplica) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.drain_seconds = 0.05;
  StartServer(o, {}, milliseconds(2));  // karm-big: >= 768 * 2 ms per image
  server::WorkerHooks slow;
  slow.on_decode_step = [](const std::string& model, const server::DecodeEvent&) {
    if (model == "karm-big") std::this_thread::sleep_for(milliseconds(2));
  };
  auto other = server::KrauseServer::Start(o, slow);
  ASSERT_TRUE(other.ok()) << other.status();
  v1::GenerateRequest req;
  req.set_model("karm-big");
  req.set_seed(7);
  req.set_temperature(0.9f);
  req.set_update_interval_ms(10);
  // Undisturbed, on the second replica alone.
  auto direct = Stub(ClientFor((*other)->port()));
  const Stream calm = RunGenerate(*direct, req);
  ASSERT_TRUE(calm.status.ok()) << calm.status.error_message();
  const std::string want = calm.messages.back().images(0).png();

  client::ConnectionOptions both;
  both.server = absl::StrCat("ipv4:127.0.0.1:", server_->port(), ",127.0.0.1:", (*other)->port());
  both.retry = true;
  auto ch = client::MakeChannel(both);
  ASSERT_TRUE(ch.ok());
  auto stub = v1::KrauseService::NewStub(*ch);
  client::ResumingGenerate g(stub.get(), both, req, client::ResumeOptions{});
  v1::GenerateResponse m;
  std::string rows, png;
  std::thread stopper;
  while (g.Read(&m)) {
    for (const auto& r : m.rows()) rows += r.pixels();
    for (const auto& im : m.images()) png = im.png();
    if (!stopper.joinable() && rows.size() >= 2 * 16 * 3) {
      // Drain whichever replica runs the stream (its one cache slot is busy).
      server::KrauseServer* serving =
          server_->registry().Find<server::ServedGenerator>("karm-big").value()->worker().active()
              ? server_.get()
              : other->get();
      stopper = std::thread([serving] { serving->Shutdown(); });
    }
  }
  ASSERT_TRUE(stopper.joinable()) << "the stream ended before rows arrived";
  stopper.join();
  const grpc::Status st = g.Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(png, want) << "the resumed image is the undisturbed one";
  EXPECT_EQ(rows.size(), 16u * 16 * 3) << "every row once";
  const client::ResumeStats stats = g.stats();
  ASSERT_EQ(stats.breaks.size(), 1u);
  EXPECT_THAT(stats.breaks[0], ::testing::HasSubstr("UNAVAILABLE: the server is shutting down"));
  EXPECT_EQ(stats.resumed_calls, 1);
  EXPECT_GE(stats.rows_kept, 2);
  (*other)->Shutdown();
}

TEST_F(ServerTest, ShutdownLetsInFlightStreamsFinishWithinTheGrace) {
  v1::GenerateRequest req;
  req.set_model("karm");
  req.set_num_images(4);
  req.set_update_interval_ms(10);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::thread stopper([&] { server_->Shutdown(); });  // drain_seconds 5
  // (A fast machine may put every image and the summary in the first message already.)
  int images = m.images_size();
  bool summary = m.has_summary();
  while (reader->Read(&m)) {
    images += m.images_size();
    summary = summary || m.has_summary();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(summary);
  stopper.join();
}

}  // namespace
}  // namespace krause::testing
