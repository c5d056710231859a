// Model control end to end through the Open Inference Protocol's model repository extension
// (over gRPC and REST: the index with states, load and unload, the admin token, a server without
// model control refusing), and --model_control explicit loading at start-up only the models
// --load_model names.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "model_control_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

namespace v1 = krause::v1;
using ::testing::HasSubstr;

// The Open Inference Protocol's model repository extension, over gRPC and REST, changes what is
// served exactly as krause.v1's model control does: the index with states, unload, load of one
// version, the admin token, and a server without model control refusing.
TEST_F(ModelControlTest, TheRepositoryExtensionControlsTheModelsOverGrpcAndRest) {
  PutVit(1, 11);
  PutVit(2, 12);
  WriteText(repo_ + "/vit/config.json", R"({"version_policy": {"latest": 1}})");
  const std::string admin = repo_ + "/admin";
  WriteText(admin, "root\n");
  rest_ = true;
  Start("explicit", "", admin);
  auto channel = client::MakeChannel(ClientFor(server_->port()));
  ASSERT_TRUE(channel.ok());
  auto oip = inference::GRPCInferenceService::NewStub(*channel);
  auto admin_ctx = [](grpc::ClientContext* ctx) {
    ctx->AddMetadata("authorization", "Bearer root");
  };
  const auto grpc_index = [&](bool ready) {
    inference::RepositoryIndexRequest req;
    req.set_ready(ready);
    inference::RepositoryIndexResponse r;
    grpc::ClientContext ctx;
    admin_ctx(&ctx);
    EXPECT_TRUE(oip->RepositoryIndex(&ctx, req, &r).ok());
    std::vector<std::string> out;
    for (const auto& m : r.models()) out.push_back(m.name() + "@" + m.version() + " " + m.state());
    return out;
  };
  // The same entries as krause.v1's RepositoryIndex.
  EXPECT_EQ(grpc_index(false), (std::vector<std::string>{"vit@1 UNAVAILABLE", "vit@2 READY"}));
  EXPECT_EQ(grpc_index(true), std::vector<std::string>{"vit@2 READY"});
  const int port = server_->http_port();
  auto post = [&](const std::string& path, const std::string& body, const std::string& token) {
    return RawHttp(port, "POST " + path + " HTTP/1.0\r\nAuthorization: Bearer " + token +
                             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                             body);
  };
  // Unload over gRPC (REST under TSan, see kProtobufMapsWork): nothing serves vit.
  if (kProtobufMapsWork) {
    inference::RepositoryModelUnloadRequest unload;
    unload.set_model_name("vit");
    (*unload.mutable_parameters())["unload_dependents"].set_bool_param(false);
    inference::RepositoryModelUnloadResponse ur;
    grpc::ClientContext ctx;
    admin_ctx(&ctx);
    const grpc::Status st = oip->RepositoryModelUnload(&ctx, unload, &ur);
    ASSERT_TRUE(st.ok()) << st.error_message();
  } else {
    ASSERT_NE(post("/v2/repository/models/vit/unload", "", "root").find(" 200 "),
              std::string::npos);
  }
  v1::ClassifyResponse cr;
  EXPECT_EQ(Classify(&cr).error_code(), grpc::StatusCode::UNAVAILABLE);
  // Load version 1 over REST (a version the policy would not choose, named).
  std::string r =
      post("/v2/repository/models/vit/load", R"({"parameters": {"version": "1"}})", "root");
  EXPECT_NE(r.find(" 200 "), std::string::npos) << r;
  ASSERT_TRUE(Classify(&cr).ok());
  EXPECT_EQ(cr.model_version(), "1");
  r = post("/v2/repository/index", R"({"ready": true})", "root");
  EXPECT_NE(r.find(R"([{"name":"vit","reason":"","state":"READY","version":"1"}])"),
            std::string::npos)
      << r;
  r = post("/v2/repository/index", "", "root");
  EXPECT_NE(r.find(R"("state":"UNAVAILABLE")"), std::string::npos) << r;
  // Unload and load back over REST, with the policy's version.
  EXPECT_NE(post("/v2/repository/models/vit/unload",
                 R"({"parameters": {"unload_dependents": false}})", "root")
                .find(" 200 "),
            std::string::npos);
  EXPECT_EQ(Classify(&cr).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(post("/v2/repository/models/vit/load", "{}", "root").find(" 200 "), std::string::npos);
  ASSERT_TRUE(Classify(&cr).ok());
  EXPECT_EQ(cr.model_version(), "2");
  // Refusals: no admin token (401), an unknown model (404), a parameter it does not take (400),
  // a GET (405).
  EXPECT_NE(post("/v2/repository/index", "", "nobody").find(" 401 "), std::string::npos);
  EXPECT_NE(post("/v2/repository/models/nope/load", "", "root").find(" 404 "), std::string::npos);
  r = post("/v2/repository/models/vit/load", R"({"parameters": {"config": "{}"}})", "root");
  EXPECT_NE(r.find(" 400 "), std::string::npos) << r;
  EXPECT_NE(r.find("unknown parameter \\\"config\\\""), std::string::npos) << r;
  EXPECT_NE(RawHttp(port, "GET /v2/repository/index HTTP/1.0\r\n\r\n").find(" 405 "),
            std::string::npos);
  if (kProtobufMapsWork) {
    inference::RepositoryModelLoadRequest load;
    load.set_model_name("vit");
    inference::RepositoryModelLoadResponse lr;
    grpc::ClientContext ctx;  // no token
    EXPECT_EQ(oip->RepositoryModelLoad(&ctx, load, &lr).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
}

// Without model control the index lists the served models and a load is FAILED_PRECONDITION.
TEST_F(ModelControlTest, TheRepositoryExtensionWithoutModelControl) {
  PutVit(1, 11);
  Start("none");
  auto channel = client::MakeChannel(ClientFor(server_->port()));
  ASSERT_TRUE(channel.ok());
  auto oip = inference::GRPCInferenceService::NewStub(*channel);
  if (kProtobufMapsWork) {
    inference::RepositoryModelLoadRequest load;
    load.set_model_name("vit");
    inference::RepositoryModelLoadResponse lr;
    grpc::ClientContext ctx;
    const grpc::Status st = oip->RepositoryModelLoad(&ctx, load, &lr);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(st.error_message(), HasSubstr("--model_control explicit"));
  }
  inference::RepositoryIndexResponse ir;
  grpc::ClientContext ictx;
  ASSERT_TRUE(oip->RepositoryIndex(&ictx, {}, &ir).ok());
  ASSERT_EQ(ir.models_size(), 1);
  EXPECT_EQ(ir.models(0).state(), "READY");
}

// --model_control explicit loads at start-up only the models --load_model names (Triton's
// --load-model); the others are in the index, not loaded, until a load; a name the repository
// lacks stops the start; the list needs explicit mode.
TEST_F(ModelControlTest, ExplicitModeLoadsOnlyTheNamedModelsAtStart) {
  PutVit(1, 11);
  PutKarm(1, 12);
  load_models_ = {"karm"};
  Start("explicit");
  const auto index = Index();
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[0], "karm@1 READY");
  EXPECT_EQ(index[1], "vit@1 UNAVAILABLE");
  v1::ClassifyResponse r;
  EXPECT_EQ(Classify(&r).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Load("vit").ok());
  ASSERT_TRUE(Classify(&r).ok());
  server_.reset();
  load_models_ = {};  // none: the server starts with no model
  Start("explicit");
  EXPECT_EQ(Index(true), std::vector<std::string>{});
  server_.reset();
  server::ServerOptions o = LoopbackOptions("");
  o.models_dir = repo_;
  o.model_control = "explicit";
  o.load_models = {"nope"};
  auto s = server::KrauseServer::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--load_model nope: no such model"));
  o.model_control = "poll";
  o.load_models = {"vit"};
  s = server::KrauseServer::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--load_model needs"));
}

}  // namespace
}  // namespace krause::testing
