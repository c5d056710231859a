// krause.v1 over HTTP with the Connect protocol (server/v1/connect_http.h), against the same
// calls over gRPC: equal answers in JSON and in binary, the protocol's errors (code, HTTP status,
// google.rpc details), the token; and the web page's routes (server/web/web_ui.h), also off.
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/escaping.h"
#include "google/rpc/error_details.pb.h"
#include "server/v1/images.h"
#include "server_test.h"

namespace krause::testing {
namespace {

using google::protobuf::Message;
using google::protobuf::util::MessageDifferencer;
using Json = nlohmann::json;

struct Answer {
  int status = 0;
  std::string head, body;
  bool Has(const std::string& header_line) const {
    return head.find("\r\n" + header_line + "\r\n") != std::string::npos;
  }
};

Answer Parse(const std::string& all) {
  Answer a;
  const size_t end = all.find("\r\n\r\n");
  if (all.size() < 12 || end == std::string::npos) return a;
  a.status = std::stoi(all.substr(9, 3));
  a.head = all.substr(0, end + 2);
  a.body = all.substr(end + 4);
  return a;
}

// One HTTP/1.0 request (the answer runs to the connection's end).
Answer Request(int port, const std::string& method, const std::string& path,
               const std::string& body, const std::string& headers) {
  return Parse(RawHttp(port,
                       method + " " + path + " HTTP/1.0\r\n" + headers +
                           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
                       20));
}

Answer Connect(int port, const std::string& method, const std::string& body,
               const std::string& headers = "Content-Type: application/json\r\n") {
  return Request(port, "POST", "/krause.v1.KrauseService/" + method, body, headers);
}

std::string ToJson(const Message& m) {
  std::string out;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(m, &out).ok());
  return out;
}

// A JSON call's answer parsed into `out`; false (with a test failure) unless it is 200.
bool JsonCall(int port, const std::string& method, const Message& request, Message* out) {
  const Answer a = Connect(port, method, ToJson(request));
  EXPECT_EQ(a.status, 200) << method << ": " << a.body;
  EXPECT_TRUE(a.Has("Content-Type: application/json")) << a.head;
  return a.status == 200 && google::protobuf::util::JsonStringToMessage(a.body, out).ok();
}

class ConnectHttpTest : public HttpServerTest {
 protected:
  // A random image of `model`'s shape, as krause.v1 sends it.
  v1::Image ImageFor(const std::string& model, uint64_t seed) {
    v1::GetModelRequest req;
    req.set_name(model);
    v1::ModelInfo info;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->GetModel(&ctx, req, &info).ok());
    return server::EncodeRawImage(
        RandomImages(1, info.height(), info.width(), info.channels(), seed)[0]);
  }

  // `method` over gRPC and over HTTP in JSON: the same answer (returned: the HTTP one).
  template <typename Request, typename Response>
  Response Both(const std::string& method, const Request& request,
                grpc::Status (v1::KrauseService::Stub::*call)(grpc::ClientContext*, const Request&,
                                                              Response*)) {
    Response grpc_reply, http_reply;
    grpc::ClientContext ctx;
    EXPECT_TRUE(((*stub_).*call)(&ctx, request, &grpc_reply).ok()) << method;
    EXPECT_TRUE(JsonCall(port(), method, request, &http_reply)) << method;
    EXPECT_TRUE(MessageDifferencer::Equals(grpc_reply, http_reply))
        << method << ": " << http_reply.DebugString();
    return http_reply;
  }
};

// Each unary method gives over HTTP, in JSON, exactly what it gives over gRPC.
TEST_F(ConnectHttpTest, JsonCallsAnswerWhatGrpcAnswers) {
  using Stub = v1::KrauseService::Stub;
  EXPECT_GE(Both("ListModels", v1::ListModelsRequest(), &Stub::ListModels).models_size(), 5);
  v1::GetModelRequest model;
  model.set_name("karm");
  EXPECT_EQ(Both("GetModel", model, &Stub::GetModel).name(), "karm");
  v1::ClassifyRequest classify;
  classify.set_model("vit");
  *classify.add_images() = ImageFor("vit", 1);
  *classify.add_images() = ImageFor("vit", 2);
  classify.set_return_probabilities(true);
  EXPECT_EQ(Both("Classify", classify, &Stub::Classify).results_size(), 2);
  v1::ScoreRequest score;
  score.set_model("karm");
  *score.add_images() = ImageFor("karm", 3);
  EXPECT_EQ(Both("Score", score, &Stub::Score).bits_per_dim_size(), 1);
  v1::InspectRequest inspect;
  inspect.set_model("vit");
  *inspect.mutable_image() = ImageFor("vit", 4);
  inspect.add_queries(0);
  inspect.add_queries(3);
  EXPECT_GT(Both("Inspect", inspect, &Stub::Inspect).layers_size(), 0);
}

// application/proto: the binary messages, the same answer.
TEST_F(ConnectHttpTest, BinaryCallsAnswerWhatGrpcAnswers) {
  v1::ClassifyRequest req;
  req.set_model("vit");
  *req.add_images() = ImageFor("vit", 5);
  v1::ClassifyResponse grpc_reply, http_reply;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Classify(&ctx, req, &grpc_reply).ok());
  const Answer a = Connect(port(), "Classify", req.SerializeAsString(),
                           "Content-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_TRUE(a.Has("Content-Type: application/proto")) << a.head;
  ASSERT_TRUE(http_reply.ParseFromString(a.body));
  EXPECT_TRUE(MessageDifferencer::Equals(grpc_reply, http_reply));
}

// Errors as the protocol writes them: the code's name and HTTP status, the message, and the
// google.rpc details; calls that are not served here say where they are.
TEST_F(ConnectHttpTest, ErrorsFollowTheProtocol) {
  v1::ClassifyRequest req;
  req.set_model("vit");
  v1::Image* im = req.add_images();
  im->mutable_raw()->set_pixels(std::string(4, '\0'));
  im->mutable_raw()->set_height(2);
  im->mutable_raw()->set_width(2);
  im->mutable_raw()->set_channels(1);
  Answer a = Connect(port(), "Classify", ToJson(req),
                     "Content-Type: application/json\r\n"
                     "X-Request-Id: r-17\r\n");
  EXPECT_EQ(a.status, 400);
  EXPECT_TRUE(a.Has("X-Request-Id: r-17")) << a.head;
  Json j = Json::parse(a.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << a.body;
  EXPECT_EQ(j["code"], "invalid_argument");
  EXPECT_EQ(j["message"].get<std::string>().rfind("images[0]: image is 2x2x1", 0), 0u) << a.body;
  ASSERT_TRUE(j["details"].is_array() && j["details"].size() == 1) << a.body;
  EXPECT_EQ(j["details"][0]["type"], "google.rpc.BadRequest");
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(j["details"][0]["value"].get<std::string>(), &bytes));
  google::rpc::BadRequest bad;
  ASSERT_TRUE(bad.ParseFromString(bytes));
  ASSERT_EQ(bad.field_violations_size(), 1);
  EXPECT_EQ(bad.field_violations(0).field(), "images[0]");

  a = Connect(port(), "Classify", R"({"topk": 3})");
  EXPECT_EQ(a.status, 400);
  EXPECT_NE(a.body.find("not a krause.v1.ClassifyRequest in JSON"), std::string::npos) << a.body;
  EXPECT_NE(a.body.find("topk"), std::string::npos) << a.body;

  a = Connect(port(), "Classify", R"({"model": "nope", "images": [{}]})");
  EXPECT_EQ(a.status, 404) << a.body;
  EXPECT_EQ(Json::parse(a.body)["code"], "not_found");

  a = Connect(port(), "Classify", R"({"model": "karm", "images": [{}]})");
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_EQ(Json::parse(a.body)["code"], "failed_precondition");

  a = Connect(port(), "Classify", "{}", "Content-Type: text/plain\r\n");
  EXPECT_EQ(a.status, 415) << a.body;
  EXPECT_TRUE(a.Has("Accept-Post: application/json, application/proto")) << a.head;

  a = Connect(port(), "ListModels", "{}",
              "Content-Type: application/json\r\nConnect-Timeout-Ms: soon\r\n");
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_NE(a.body.find("Connect-Timeout-Ms"), std::string::npos) << a.body;

  a = Connect(port(), "ListModels", "{}",
              "Content-Type: application/json\r\nContent-Encoding: gzip\r\n");
  EXPECT_EQ(a.status, 415) << a.body;

  a = Request(port(), "GET", "/krause.v1.KrauseService/ListModels", "", "");
  EXPECT_EQ(a.status, 405);
  EXPECT_TRUE(a.Has("Allow: POST")) << a.head;

  a = Connect(port(), "Generate", "{}");
  EXPECT_EQ(a.status, 501);
  EXPECT_EQ(Json::parse(a.body)["code"], "unimplemented");
  EXPECT_NE(a.body.find("generate_stream"), std::string::npos) << a.body;

  a = Connect(port(), "Nope", "{}");
  EXPECT_EQ(a.status, 404);
  EXPECT_EQ(Json::parse(a.body)["code"], "unimplemented");
}

// With --auth_tokens a call needs the bearer token (401 and WWW-Authenticate without it); the
// page itself needs none.
TEST_F(ConnectHttpTest, CallsNeedTheTokenThePageDoesNot) {
  StartServer(WithTokens("secret\n", Options()));
  Answer a = Connect(port(), "ListModels", "{}");
  EXPECT_EQ(a.status, 401) << a.body;
  EXPECT_EQ(Json::parse(a.body)["code"], "unauthenticated");
  EXPECT_TRUE(a.Has("WWW-Authenticate: Bearer")) << a.head;
  a = Connect(port(), "ListModels", "{}",
              "Content-Type: application/json\r\nAuthorization: Bearer secret\r\n");
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(Request(port(), "GET", "/", "", "").status, 200);
}

// The page: / and /ui/{file} from the binary, with an ETag that a revalidation gets 304 for.
TEST_F(ConnectHttpTest, TheWebPageIsServedFromTheBinary) {
  Answer a = Request(port(), "GET", "/", "", "");
  ASSERT_EQ(a.status, 200);
  EXPECT_TRUE(a.Has("Content-Type: text/html; charset=utf-8")) << a.head;
  EXPECT_NE(a.body.find("<title>krause-serve</title>"), std::string::npos);
  EXPECT_NE(a.head.find("Content-Security-Policy: default-src 'self'"), std::string::npos);
  const size_t at = a.head.find("ETag: ");
  ASSERT_NE(at, std::string::npos) << a.head;
  const std::string etag = a.head.substr(at + 6, a.head.find("\r\n", at) - at - 6);
  EXPECT_EQ(Request(port(), "GET", "/", "", "If-None-Match: " + etag + "\r\n").status, 304);
  a = Request(port(), "GET", "/ui/app.js", "", "");
  EXPECT_EQ(a.status, 200);
  EXPECT_TRUE(a.Has("Content-Type: text/javascript; charset=utf-8")) << a.head;
  EXPECT_NE(a.body.find("generate_stream"), std::string::npos);
  EXPECT_EQ(Request(port(), "GET", "/ui/style.css", "", "").status, 200);
  EXPECT_EQ(Request(port(), "GET", "/ui/nope.js", "", "").status, 404);
  EXPECT_EQ(Request(port(), "POST", "/", "", "").status, 405);
  // The REST API beside it is unchanged.
  EXPECT_EQ(Request(port(), "GET", "/v2/health/live", "", "").status, 200);
}

TEST_F(ConnectHttpTest, WebUiFalseServesOnlyTheApis) {
  server_->Shutdown();
  server::ServerOptions o = Options();
  o.web_ui = false;
  StartServer(o);
  const Answer a = Request(port(), "GET", "/", "", "");
  EXPECT_EQ(a.status, 404);
  EXPECT_EQ(a.body.find("<html"), std::string::npos);
  EXPECT_EQ(Request(port(), "GET", "/ui/app.js", "", "").status, 404);
  EXPECT_EQ(Connect(port(), "ListModels", "{}").status, 200);
}

}  // namespace
}  // namespace krause::testing
