// End-to-end tests of who may call krause-server and what it records (in process, on loopback
// ports; server_test.h): bearer tokens and their tenants, the request log's line per call with
// the caller's ids sent back and its tenant, and TLS with and without client certificates.
#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

TEST_F(ServerTest, TokenAuthentication) {
  StartServer(
      WithTokens("# tokens\nsecret-one\n\nsecret-two\n", LoopbackOptions(models_.manifest)));
  auto call = [&](const std::string& token) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", token);
    v1::ListModelsResponse r;
    return stub_->ListModels(&ctx, {}, &r).error_code();
  };
  EXPECT_EQ(call(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("Bearer wrong"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("secret-one"), grpc::StatusCode::UNAUTHENTICATED);  // no "Bearer "
  EXPECT_EQ(call("Bearer secret-one"), grpc::StatusCode::OK);
  EXPECT_EQ(call("Bearer secret-two"), grpc::StatusCode::OK);
  // The scheme is case-insensitive, the token is not.
  EXPECT_EQ(call("bearer secret-one"), grpc::StatusCode::OK);
  EXPECT_EQ(call("BEARER secret-two"), grpc::StatusCode::OK);
  EXPECT_EQ(call("bearer SECRET-ONE"), grpc::StatusCode::UNAUTHENTICATED);
  // Streams too, and nothing ran: no slot was taken.
  v1::GenerateRequest req;
  EXPECT_EQ(RunGenerate(*stub_, req, 0, "bad").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(RunGenerate(*stub_, req, 0, "secret-two").status.error_code(), grpc::StatusCode::OK);
  // Health needs no token.
  auto ch = client::MakeChannel(conn_);
  auto health = grpc::health::v1::Health::NewStub(*ch);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse r;
  EXPECT_TRUE(health->Check(&ctx, {}, &r).ok());
}

TEST_F(ServerTest, RequestLogHasALinePerCallAndTheCallersIdsComeBack) {
  server_->Shutdown();
  const std::string log = models_.dir + "/requests.jsonl";
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.request_log = log;
  StartServer(o);
  // Classify with a request id: echoed in the initial metadata.
  {
    v1::ClassifyRequest req;
    req.set_model("vit");
    *req.add_images() = RawImage(RandomImages(1, 8, 8, 1, 4)[0]);
    *req.add_images() = RawImage(RandomImages(1, 8, 8, 1, 5)[0]);
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "req-42");
    v1::ClassifyResponse r;
    ASSERT_TRUE(stub_->Classify(&ctx, req, &r).ok());
    const auto& md = ctx.GetServerInitialMetadata();
    const auto it = md.find("x-request-id");
    ASSERT_NE(it, md.end());
    EXPECT_EQ(std::string(it->second.data(), it->second.size()), "req-42");
  }
  // Generate with a traceparent, and a call for an unknown model.
  const std::string trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  {
    v1::GenerateRequest req;
    req.set_model("karm");
    req.set_num_images(2);
    req.set_seed(1);
    grpc::ClientContext ctx;
    ctx.AddMetadata("traceparent", trace);
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
    const auto& md = ctx.GetServerInitialMetadata();
    ASSERT_NE(md.find("traceparent"), md.end());
  }
  {
    v1::GetModelRequest g;
    g.set_name("nope");
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    EXPECT_EQ(stub_->GetModel(&ctx, g, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  server_->Shutdown();  // every line written
  std::ifstream in(log);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["rpc"], "Classify");
  EXPECT_EQ(lines[0]["model"], "vit");
  EXPECT_EQ(lines[0]["code"], "OK");
  EXPECT_EQ(lines[0]["images"], 2);
  EXPECT_EQ(lines[0]["request_id"], "req-42");
  EXPECT_FALSE(lines[0].contains("traceparent"));
  EXPECT_GE(lines[0]["seconds"].get<double>(), lines[0]["queue_seconds"].get<double>());
  EXPECT_EQ(lines[1]["rpc"], "Generate");
  EXPECT_EQ(lines[1]["model"], "karm");
  EXPECT_EQ(lines[1]["images"], 2);
  EXPECT_EQ(lines[1]["traceparent"], trace);
  EXPECT_EQ(lines[2]["rpc"], "GetModel");
  EXPECT_EQ(lines[2]["code"], "NOT_FOUND");
  for (const auto& l : lines) {
    EXPECT_NE(l["peer"].get<std::string>().find("127.0.0.1"), std::string::npos);
    EXPECT_EQ(l["tenant"], "default");  // no tokens: every call is the default tenant's
  }
}

// The token file's tenants: each token serves as its tenant, and the request log names it (a
// call refused for its token has none).
TEST_F(ServerTest, EachTokensTenantIsNamedInTheRequestLog) {
  server::ServerOptions o = WithTokens(
      "tok-a tenant=team-a weight=2 max_queued=8\ntok-a2 tenant=team-a\ntok-b tenant=team-b\n",
      LoopbackOptions(models_.manifest));
  const std::string log = models_.dir + "/tenants.jsonl";
  o.request_log = log;
  StartServer(o);
  for (const char* token : {"Bearer tok-a", "Bearer tok-b", "Bearer tok-a2", "Bearer nope"}) {
    v1::ClassifyRequest req;
    req.set_model("vit");
    *req.add_images() = RawImage(RandomImages(1, 8, 8, 1, 4)[0]);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", token);
    v1::ClassifyResponse r;
    EXPECT_EQ(stub_->Classify(&ctx, req, &r).ok(), std::string(token) != "Bearer nope") << token;
  }
  // /metrics counts each configured tenant's calls and images; its gauges read the gate and the
  // queues (idle once the server has shut down: a call leaves the gate after its client has the
  // reply, so a scrape right after the last call may still count it in flight).
  server_->Shutdown();
  const std::string scrape = server_->metrics().Scrape();
  for (const char* line : {"krause_tenant_calls_total{tenant=\"team-a\"} 2",
                           "krause_tenant_calls_total{tenant=\"team-b\"} 1",
                           "krause_tenant_images_total{tenant=\"team-a\"} 2",
                           "krause_tenant_images_total{tenant=\"team-b\"} 1",
                           "krause_tenant_calls_in_flight{tenant=\"team-a\"} 0",
                           "krause_tenant_queued_calls{tenant=\"team-b\"} 0"})
    EXPECT_NE(scrape.find(line), std::string::npos) << line << "\n" << scrape;
  EXPECT_EQ(scrape.find("tenant=\"default\""), std::string::npos) << "only the file's tenants";
  std::ifstream in(log);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["tenant"], "team-a");
  EXPECT_EQ(lines[1]["tenant"], "team-b");
  EXPECT_EQ(lines[2]["tenant"], "team-a");
  EXPECT_EQ(lines[3]["code"], "UNAUTHENTICATED");
  EXPECT_FALSE(lines[3].contains("tenant"));
  // A file whose tenants disagree does not start the server, naming the line.
  WriteText(models_.dir + "/tokens", "t1 tenant=x weight=1\nt2 tenant=x weight=2\n");
  auto bad = server::KrauseServer::Start(o, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("tokens:2: tenant x's weight is 2 here but 1"),
            std::string::npos)
      << bad.status();
}

// A call's priority: 0 .. 2, and 2 only for a tenant whose max_priority allows it; krause.v1's
// Classify and Generate check it alike (PERMISSION_DENIED / INVALID_ARGUMENT naming priority).
TEST_F(ServerTest, PriorityIsCheckedAgainstTheTenantsMaxPriority) {
  StartServer(WithTokens("tok-a tenant=team-a max_priority=2\ntok-b tenant=team-b\n",
                         LoopbackOptions(models_.manifest)));
  const auto classify = [&](const char* token, uint32_t priority) {
    v1::ClassifyRequest req;
    req.set_model("vit");
    req.set_priority(priority);
    *req.add_images() = RawImage(RandomImages(1, 8, 8, 1, 4)[0]);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + token);
    v1::ClassifyResponse r;
    return stub_->Classify(&ctx, req, &r);
  };
  EXPECT_TRUE(classify("tok-a", 2).ok());
  EXPECT_TRUE(classify("tok-b", 1).ok());
  grpc::Status st = classify("tok-b", 2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(st.error_message(),
            "priority 2 is not allowed to tenant team-b: its max_priority is 1 (the token file's "
            "max_priority=)");
  st = classify("tok-a", 3);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "priority 3 is out of range [0, 2]");
  v1::GenerateRequest g;
  g.set_model("karm");
  g.set_seed(1);
  g.set_priority(2);
  EXPECT_TRUE(RunGenerate(*stub_, g, 0, "tok-a").status.ok());
  EXPECT_EQ(RunGenerate(*stub_, g, 0, "tok-b").status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(ServerTest, TlsAndMutualTls) {
  server_->Shutdown();
  const std::string certs = models_.dir + "/certs";
  std::filesystem::create_directories(certs);
  const std::string script = std::string(KRAUSE_SOURCE_DIR) + "/tests/make_test_certs.sh";
  ASSERT_EQ(std::system(("sh " + script + " " + certs).c_str()), 0) << "openssl failed";
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.tls_cert = certs + "/server.pem";
  o.tls_key = certs + "/server.key";
  StartServer(o);
  auto list = [&](const client::ConnectionOptions& c) {
    auto stub = Stub(c);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListModelsResponse r;
    return stub->ListModels(&ctx, {}, &r).error_code();
  };
  client::ConnectionOptions tls = conn_;
  tls.tls_ca = certs + "/ca.pem";
  tls.server = "localhost:" + std::to_string(server_->port());
  EXPECT_EQ(list(tls), grpc::StatusCode::OK);
  // A failed handshake is UNAVAILABLE (the transport never came up), and the server stays up.
  EXPECT_EQ(list(conn_), grpc::StatusCode::UNAVAILABLE) << "plaintext to a TLS server";
  EXPECT_EQ(list(tls), grpc::StatusCode::OK);
  server_->Shutdown();

  o.tls_client_ca = certs + "/ca.pem";
  StartServer(o);
  tls.server = "localhost:" + std::to_string(server_->port());
  EXPECT_EQ(list(tls), grpc::StatusCode::UNAVAILABLE) << "mutual TLS without a client certificate";
  client::ConnectionOptions mtls = tls;
  mtls.tls_cert = certs + "/client.pem";
  mtls.tls_key = certs + "/client.key";
  EXPECT_EQ(list(mtls), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace krause::testing
