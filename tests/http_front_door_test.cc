// The HTTP port's front door (server/edge/http_front_door.h): each path goes to the route that
// registered it (the longest prefix; a route naming last segments takes only those; an exact
// route only its path), a path no route takes is a 404 JSON error, and a request the HTTP server
// refused itself (here a body over the limit: 413) is counted under the protocol and the call of
// the route its path belongs to, not under one protocol for the whole port.
#include "server/edge/http_front_door.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "server/edge/call_book.h"
#include "server/edge/gate.h"
#include "tests/http_server_test.h"

namespace krause::server {
namespace {

struct Done {
  std::string rpc, protocol;
  absl::StatusCode code;
};

// Records every finished call.
class Recorder : public CallObserver {
 public:
  void OnCallDone(const std::string& rpc, const std::string& protocol, const std::string&,
                  const std::string&, absl::StatusCode code, double) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back({rpc, protocol, code});
    cv_.notify_all();
  }
  // Waits (up to 20 s) for the n-th finished call.
  Done Wait(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return done_.size() >= n; });
    return done_.size() >= n ? done_[n - 1] : Done{};
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Done> done_;
};

// A route whose handler answers its own name.
HttpRoute Named(std::string name, std::string prefix, const char* protocol, bool exact = false,
                std::vector<std::string> last = {}) {
  HttpRoute r;
  r.prefix = std::move(prefix);
  r.exact = exact;
  r.last_segments = std::move(last);
  r.protocol = protocol;
  r.rpc = [](std::string_view) { return "Call"; };
  r.handler = [name](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->Reply({200, {{"Content-Type", "text/plain"}}, name});
  };
  return r;
}

// One request over a fresh connection; the whole response (up to the server's close).
std::string Exchange(int port, const std::string& request) {
  const int fd = http_testing::Connect(port);
  http_testing::SendAll(fd, request);
  std::string out = http_testing::ReadUntil(fd, [](const std::string&) { return false; });
  close(fd);
  return out;
}

class HttpFrontDoorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    edge_.gate = &gate_;
    edge_.observer = &recorder_;
    HttpFrontDoorOptions o;
    o.address = "127.0.0.1:0";
    o.threads = 1;
    o.max_body_bytes = 100;
    o.not_found_hint = " (try /v2)";
    auto door = HttpFrontDoor::Start(
        o,
        {Named("oip", "/v2", kProtocolOipRest),
         Named("generation", "/v2/models/", kProtocolKrauseHttp, false,
               {"generate", "generate_stream"}),
         Named("connect", "/krause.v1.KrauseService/", kProtocolKrauseConnect),
         Named("page", "/", "web", /*exact=*/true), Named("files", "/ui/", "web")},
        &edge_);
    ASSERT_TRUE(door.ok()) << door.status();
    door_ = std::move(*door);
  }
  std::string Get(const std::string& target) {
    return Exchange(door_->port(),
                    "GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  }
  std::string OverLimit(const std::string& target) {  // a body over max_body_bytes: 413
    return Exchange(door_->port(), "POST " + target +
                                       " HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                                       "Connection: close\r\n\r\n");
  }

  Gate gate_;
  Recorder recorder_;
  FrontEndContext edge_;
  std::unique_ptr<HttpFrontDoor> door_;
};

std::string Body(const std::string& response) {
  const size_t head = response.find("\r\n\r\n");
  return head == std::string::npos ? "" : response.substr(head + 4);
}

TEST_F(HttpFrontDoorTest, EachPathGoesToTheRouteThatRegisteredIt) {
  const auto route = [&](std::string_view path) {
    const HttpRoute* r = door_->RouteOf(path);
    return r == nullptr ? std::string("none") : r->prefix;
  };
  EXPECT_EQ(route("/v2"), "/v2");
  EXPECT_EQ(route("/v2/models/karm/infer"), "/v2");
  EXPECT_EQ(route("/v2/models/karm/generate_stream"), "/v2/models/");  // the longer prefix
  EXPECT_EQ(route("/v2/models/karm/versions/2/generate"), "/v2/models/");
  EXPECT_EQ(route("/v2/models/karm"), "/v2");  // not a segment the generation names
  EXPECT_EQ(route("/krause.v1.KrauseService/Classify"), "/krause.v1.KrauseService/");
  EXPECT_EQ(route("/"), "/");
  EXPECT_EQ(route("/ui/app.js"), "/ui/");
  EXPECT_EQ(route("/elsewhere"), "none");  // "/" is exact
  // Through the server: the route's handler answers, the query does not count.
  EXPECT_EQ(Body(Get("/v2/models/m/generate_stream?x=1")), "generation");
  EXPECT_EQ(Body(Get("/krause.v1.KrauseService/GetModel")), "connect");
  EXPECT_EQ(Body(Get("/")), "page");
  const std::string missing = Get("/elsewhere");
  EXPECT_NE(missing.find("404"), std::string::npos) << missing;
  EXPECT_EQ(Body(missing), R"j({"error":"no such path: /elsewhere (try /v2)"})j");
}

TEST_F(HttpFrontDoorTest, RefusalsCountUnderTheProtocolOfTheirPath) {
  struct Case {
    std::string target, protocol, rpc;
  } cases[] = {{"/krause.v1.KrauseService/Classify", kProtocolKrauseConnect, "Call"},
               {"/v2/models/m/generate_stream", kProtocolKrauseHttp, "Call"},
               {"/v2/models/m/infer", kProtocolOipRest, "Call"},
               {"/elsewhere", kProtocolHttp, "HTTP"}};
  size_t n = 0;
  for (const Case& c : cases) {
    const std::string answer = OverLimit(c.target);
    EXPECT_NE(answer.find(" 413 "), std::string::npos) << c.target << ": " << answer;
    const Done d = recorder_.Wait(++n);
    EXPECT_EQ(d.protocol, c.protocol) << c.target;
    EXPECT_EQ(d.rpc, c.rpc) << c.target;
    EXPECT_EQ(d.code, absl::StatusCode::kResourceExhausted) << c.target;
  }
}

}  // namespace
}  // namespace krause::server
