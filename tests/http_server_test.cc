// The event-driven HTTP server (server/edge/http_server.h) over real loopback sockets, with a
// plain blocking client (http_server_test.h): answers now and later, keep-alive, every limit (408
// for slow headers and bodies, 413 before the body is sent, 431, idle connections closed
// quietly), streamed answers (chunked on HTTP/1.1, to the connection's end on 1.0), a client
// leaving while its request waits or streams, many idle connections beside a request on two loop
// threads, and exchanges that outlive the server. HTTPS: http_server_tls_test.cc. No outcome is
// decided by sleeping: every wait is for an event, with a cap.
#include "server/edge/http_server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http_server_test.h"

namespace krause::server {
namespace {

using http_testing::Body;
using http_testing::Connect;
using http_testing::Dechunk;
using http_testing::Echo;
using http_testing::Loopback;
using http_testing::ReadResponse;
using http_testing::ReadUntil;
using http_testing::SendAll;
using http_testing::StartOrDie;
using http_testing::WaitFor;

TEST(HttpServer, AnswersAndKeepsTheConnectionForTheNextRequest) {
  auto server = StartOrDie(Loopback(), Echo());
  const int fd = Connect(server->port());
  SendAll(fd, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 15), "HTTP/1.1 200 OK") << r;
  EXPECT_EQ(Body(r), "GET /a ");
  SendAll(fd, "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  r = ReadResponse(fd);
  EXPECT_EQ(Body(r), "POST /b hello") << r;
  close(fd);
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  auto server = StartOrDie(Loopback(), Echo());
  const int fd = Connect(server->port());
  SendAll(fd, "GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string both =
      ReadUntil(fd, [](const std::string& t) { return t.find("GET /2 ") != std::string::npos; });
  EXPECT_LT(both.find("GET /1 "), both.find("GET /2 ")) << both;
  close(fd);
}

TEST(HttpServer, AnswersFromAnotherThreadWhenReady) {
  std::promise<std::shared_ptr<HttpExchange>> got;
  auto server = StartOrDie(Loopback(), [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    got.set_value(ex);  // the loop thread returns at once; the answer comes later
  });
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  std::shared_ptr<HttpExchange> ex = got.get_future().get();
  std::thread([ex] { ex->Reply({201, {}, "later"}); }).join();
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 201") << r;
  EXPECT_EQ(Body(r), "later");
  ex->Reply({500, {}, "twice"});  // a second answer does nothing
  close(fd);
}

TEST(HttpServer, SlowHeadersGet408AndTheConnectionCloses) {
  HttpServerOptions o = Loopback();
  o.header_timeout_ms = 200;
  auto server = StartOrDie(o, Echo());
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\n");  // never ends its headers
  bool closed = false;
  const std::string r = ReadUntil(
      fd, [](const std::string&) { return false; }, &closed);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 408") << r;
  EXPECT_NE(r.find("did not arrive within 200 ms"), std::string::npos) << r;
  EXPECT_TRUE(closed);
  close(fd);
}

TEST(HttpServer, SlowBodyGets408) {
  HttpServerOptions o = Loopback();
  o.body_timeout_ms = 200;
  auto server = StartOrDie(o, Echo());
  const int fd = Connect(server->port());
  SendAll(fd, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten..");
  bool closed = false;
  const std::string r = ReadUntil(
      fd, [](const std::string&) { return false; }, &closed);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 408") << r;
  EXPECT_NE(r.find("body did not arrive"), std::string::npos) << r;
  EXPECT_TRUE(closed);
  close(fd);
}

TEST(HttpServer, ABodyOverTheLimitGets413BeforeItIsSent) {
  HttpServerOptions o = Loopback();
  o.max_body_bytes = 1000;
  std::mutex mu;
  std::vector<HttpRefusal> refused;
  o.on_refused = [&](const HttpRefusal& r) {
    std::lock_guard<std::mutex> lock(mu);
    refused.push_back(r);
  };
  bool called = false;
  auto server = StartOrDie(o, [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    called = true;
    ex->Reply({200, {}, ""});
  });
  const int fd = Connect(server->port());
  SendAll(fd, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 413") << r;
  EXPECT_NE(r.find("over the limit of 1000 bytes"), std::string::npos) << r;
  EXPECT_FALSE(called);
  close(fd);
  // The refusal is told, with what it was for (to be counted and logged).
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].status, 413);
  EXPECT_EQ(refused[0].method, "POST");
  EXPECT_EQ(refused[0].target, "/");
  EXPECT_NE(refused[0].why.find("over the limit"), std::string::npos);
  EXPECT_EQ(refused[0].peer.substr(0, 15), "ipv4:127.0.0.1:");
}

// A client that sends its whole oversized body anyway (as most HTTP libraries do) still reads
// the 413: the server drops what follows instead of resetting the connection.
TEST(HttpServer, AClientStillSendingAnOversizedBodyReadsThe413) {
  HttpServerOptions o = Loopback();
  o.max_body_bytes = 1000;
  auto server = StartOrDie(o, Echo());
  const int fd = Connect(server->port());
  const std::string body(5 << 20, 'x');
  SendAll(fd, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                  "\r\n\r\n");
  SendAll(fd, body);  // fails (and the test with it) if the server reset the connection
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 413") << r.substr(0, 200);
  close(fd);
}

TEST(HttpServer, AChunkedBodyOverTheLimitGets413) {
  HttpServerOptions o = Loopback();
  o.max_body_bytes = 10;
  auto server = StartOrDie(o, Echo());
  const int fd = Connect(server->port());
  SendAll(fd,
          "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
          "8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n");
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 413") << r;
  close(fd);
}

TEST(HttpServer, HeadersOverTheLimitGet431) {
  HttpServerOptions o = Loopback();
  o.max_header_bytes = 512;
  auto server = StartOrDie(o, Echo());
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 431") << r;
  close(fd);
}

TEST(HttpServer, MalformedRequestGets400) {
  auto server = StartOrDie(Loopback(), Echo());
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost x\r\n\r\n");
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 400") << r;
  close(fd);
}

TEST(HttpServer, ExpectContinueIsAnswered) {
  auto server = StartOrDie(Loopback(), Echo());
  const int fd = Connect(server->port());
  SendAll(fd, "POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
  const std::string cont =
      ReadUntil(fd, [](const std::string& t) { return t.find("\r\n\r\n") != std::string::npos; });
  EXPECT_EQ(cont, "HTTP/1.1 100 Continue\r\n\r\n");
  SendAll(fd, "abc");
  EXPECT_EQ(Body(ReadResponse(fd)), "POST /c abc");
  close(fd);
}

TEST(HttpServer, IdleConnectionsAreClosedQuietly) {
  HttpServerOptions o = Loopback();
  o.header_timeout_ms = 200;  // a new connection's first bytes
  o.idle_timeout_ms = 200;    // between requests
  auto server = StartOrDie(o, Echo());
  const int fresh = Connect(server->port());
  bool closed = false;
  std::string r = ReadUntil(
      fresh, [](const std::string&) { return false; }, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(r, "");  // no 408 to a connection that sent nothing
  const int kept = Connect(server->port());
  SendAll(kept, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  r = ReadResponse(kept);
  EXPECT_EQ(Body(r), "GET / ");
  r = ReadUntil(
      kept, [](const std::string&) { return false; }, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(r, "");
  EXPECT_TRUE(WaitFor([&] { return server->open_connections() == 0; }));
  close(fresh);
  close(kept);
}

TEST(HttpServer, AClientLeavingWhileItsRequestWaitsIsNoticed) {
  std::promise<std::shared_ptr<HttpExchange>> got;
  std::promise<void> gone;
  auto server = StartOrDie(Loopback(), [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->OnGone([&gone] { gone.set_value(); });
    got.set_value(ex);
  });
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  std::shared_ptr<HttpExchange> ex = got.get_future().get();
  EXPECT_FALSE(ex->Gone());
  close(fd);
  EXPECT_EQ(gone.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(ex->Gone());
  ex->Reply({200, {}, "too late"});  // harmless
  EXPECT_TRUE(WaitFor([&] { return server->open_connections() == 0; }));
}

TEST(HttpServer, StreamsChunksThenServesTheNextRequest) {
  std::promise<std::shared_ptr<HttpExchange>> got;
  int calls = 0;
  auto server = StartOrDie(Loopback(), [&](HttpRequest r, std::shared_ptr<HttpExchange> ex) {
    if (++calls == 1) {
      got.set_value(ex);
    } else {
      ex->Reply({200, {}, "next " + r.target});
    }
  });
  const int fd = Connect(server->port());
  SendAll(fd, "GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
  std::shared_ptr<HttpExchange> ex = got.get_future().get();
  std::thread writer([ex] {
    ex->StartStream(200, {{"Content-Type", "text/event-stream"}});
    for (int i = 0; i < 50; ++i) ex->Send("data: " + std::to_string(i) + "\n\n");
    ex->End();
  });
  bool complete = false;
  const std::string r = ReadUntil(fd, [&](const std::string& t) {
    const size_t head = t.find("\r\n\r\n");
    if (head == std::string::npos) return false;
    Dechunk(t.substr(head + 4), &complete);
    return complete;
  });
  writer.join();
  ASSERT_TRUE(complete) << r;
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Type: text/event-stream"), std::string::npos) << r;
  std::string expected;
  for (int i = 0; i < 50; ++i) expected += "data: " + std::to_string(i) + "\n\n";
  EXPECT_EQ(Dechunk(Body(r), &complete), expected);
  EXPECT_TRUE(WaitFor([&] { return ex->Backlog() == 0; }));
  SendAll(fd, "GET /n HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(Body(ReadResponse(fd)), "next /n");
  close(fd);
}

// A stream with a keep-alive writes its piece whenever it has had nothing to write for the
// interval, and not while it is sending; the pieces end with the stream.
TEST(HttpServer, AnIdleStreamSendsItsKeepAlive) {
  std::promise<std::shared_ptr<HttpExchange>> got;
  auto server = StartOrDie(Loopback(), [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->StartStream(200, {}, {": ping\n\n", 20});
    got.set_value(ex);
  });
  const int fd = Connect(server->port());
  SendAll(fd, "GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
  std::shared_ptr<HttpExchange> ex = got.get_future().get();
  bool complete = false;
  // Two pings on an idle stream, then an event, then the end.
  std::string r = ReadUntil(fd, [&](const std::string& t) {
    const size_t head = t.find("\r\n\r\n");
    if (head == std::string::npos) return false;
    return Dechunk(t.substr(head + 4), &complete) == ": ping\n\n: ping\n\n";
  });
  ex->Send("data: x\n\n");
  ex->End();
  r += ReadUntil(fd, [&](const std::string& t) {
    Dechunk(Body(r + t), &complete);
    return complete;
  });
  ASSERT_TRUE(complete) << r;
  const std::string body = Dechunk(Body(r), &complete);
  EXPECT_EQ(body.substr(0, 16), ": ping\n\n: ping\n\n") << body;
  EXPECT_NE(body.find("data: x\n\n"), std::string::npos) << body;
  close(fd);
}

TEST(HttpServer, AnHttp10StreamEndsWithTheConnection) {
  auto server = StartOrDie(Loopback(), [](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->StartStream(200, {});
    ex->Send("one ");
    ex->Send("two");
    ex->End();
  });
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.0\r\n\r\n");
  bool closed = false;
  const std::string r = ReadUntil(
      fd, [](const std::string&) { return false; }, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(r.find("chunked"), std::string::npos) << r;
  EXPECT_EQ(Body(r), "one two") << r;
  close(fd);
}

TEST(HttpServer, AClientLeavingMidStreamIsNoticed) {
  std::promise<void> gone;
  std::atomic<bool> stop{false};
  std::thread writer;
  auto server = StartOrDie(Loopback(), [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->OnGone([&gone] { gone.set_value(); });
    ex->StartStream(200, {});
    writer = std::thread([ex, &stop] {
      while (!ex->Gone() && !stop) {
        ex->Send("data: x\n\n");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a producer's pace
      }
    });
  });
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  ReadUntil(fd, [](const std::string& t) { return t.find("data: x") != std::string::npos; });
  close(fd);
  const bool noticed =
      gone.get_future().wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  stop = true;
  writer.join();
  EXPECT_TRUE(noticed);
  EXPECT_TRUE(WaitFor([&] { return server->open_connections() == 0; }));
}

TEST(HttpServer, ManyIdleConnectionsDoNotDelayARequestOnTwoThreads) {
  HttpServerOptions o = Loopback();
  o.header_timeout_ms = 60000;  // the idle ones stay for the whole test
  auto server = StartOrDie(o, Echo());
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(Connect(server->port()));
  ASSERT_TRUE(WaitFor([&] { return server->open_connections() == 300; }));
  const int fd = Connect(server->port());
  SendAll(fd, "GET /busy HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(Body(ReadResponse(fd)), "GET /busy ");
  close(fd);
  for (int f : idle) close(f);
  EXPECT_TRUE(WaitFor([&] { return server->open_connections() == 0; }));
}

TEST(HttpServer, AHandlerThatThrowsGives500) {
  auto server = StartOrDie(Loopback(), [](HttpRequest, std::shared_ptr<HttpExchange>) {
    throw std::runtime_error("boom");
  });
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 500") << r;
  EXPECT_EQ(r.find("boom"), std::string::npos) << r;  // no internals to the client
  close(fd);
}

TEST(HttpServer, ExchangesThatOutliveTheServerDoNothing) {
  std::promise<std::shared_ptr<HttpExchange>> got;
  auto server = StartOrDie(
      Loopback(), [&](HttpRequest, std::shared_ptr<HttpExchange> ex) { got.set_value(ex); });
  const int fd = Connect(server->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  std::shared_ptr<HttpExchange> ex = got.get_future().get();
  server.reset();
  ex->Reply({200, {}, "after"});
  ex->StartStream(200, {});
  ex->Send("x");
  ex->End();
  ex->OnGone([] {});
  close(fd);
}

TEST(HttpServer, BadAddressesAreRefused) {
  HttpServerOptions o = Loopback();
  o.address = "nonsense";
  EXPECT_EQ(HttpServer::Start(o, Echo()).status().code(), absl::StatusCode::kInvalidArgument);
  o.address = "127.0.0.1:99999";
  EXPECT_EQ(HttpServer::Start(o, Echo()).status().code(), absl::StatusCode::kInvalidArgument);
  o = Loopback();
  o.threads = 0;
  EXPECT_EQ(HttpServer::Start(o, Echo()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace krause::server
