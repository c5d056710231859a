// The event-driven HTTP server (server/edge/http_server.h) over HTTPS, on loopback sockets with
// throw-away certificates: it answers HTTPS and gives a plain-HTTP client no answer; with a client
// CA, a client without a certificate gets none either; a bad certificate is refused at start.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "http_server_test.h"
#include "https_client.h"
#include "server/edge/http_server.h"

namespace krause::server {
namespace {

using http_testing::Body;
using http_testing::Connect;
using http_testing::Echo;
using http_testing::Loopback;
using http_testing::ReadUntil;
using http_testing::SendAll;
using http_testing::StartOrDie;

// Throw-away certificates (tests/make_test_certs.sh) in a fresh folder.
class HttpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/krause-https-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::string script = std::string(KRAUSE_SOURCE_DIR) + "/tests/make_test_certs.sh";
    ASSERT_EQ(std::system(("sh " + script + " " + dir_).c_str()), 0) << "openssl failed";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Read(const std::string& name) {
    std::ifstream f(dir_ + "/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  HttpServerOptions Tls(bool client_ca) {
    HttpServerOptions o = Loopback();
    o.tls = HttpTls{Read("server.pem"), Read("server.key"), client_ca ? Read("ca.pem") : ""};
    return o;
  }
  std::string Path(const std::string& name) { return dir_ + "/" + name; }
  std::string dir_;
};

TEST_F(HttpsTest, ServesHttpsAndNoAnswerToPlainHttp) {
  int handled = 0;
  auto server = StartOrDie(Tls(false), [&](HttpRequest r, std::shared_ptr<HttpExchange> ex) {
    ++handled;
    ex->Reply({200, {}, "over tls " + r.target});
  });
  const auto r = testing::HttpsRequest(
      server->port(), "GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", Path("ca.pem"));
  ASSERT_TRUE(r.handshake_ok) << r.error;
  EXPECT_NE(r.received.find("HTTP/1.1 200"), std::string::npos) << r.received;
  EXPECT_EQ(Body(r.received), "over tls /a");
  // Plain HTTP (a token in it, as a careless client sends one): closed without any answer, and
  // no handler sees it.
  const int fd = Connect(server->port());
  SendAll(fd, "GET /b HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n\r\n");
  bool closed = false;
  const std::string got = ReadUntil(
      fd, [](const std::string&) { return false; }, &closed);
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(got.find("HTTP/"), std::string::npos) << got;
  EXPECT_EQ(handled, 1);
}

TEST_F(HttpsTest, MutualTlsRefusesAClientWithoutACertificate) {
  auto server = StartOrDie(Tls(true), [](HttpRequest r, std::shared_ptr<HttpExchange> ex) {
    ex->Reply({200, {}, "hello"});
  });
  const std::string get = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const auto without = testing::HttpsRequest(server->port(), get, Path("ca.pem"));
  EXPECT_EQ(without.received.find("HTTP/"), std::string::npos) << without.received;
  const auto with = testing::HttpsRequest(server->port(), get, Path("ca.pem"), Path("client.pem"),
                                          Path("client.key"));
  ASSERT_TRUE(with.handshake_ok) << with.error;
  EXPECT_EQ(Body(with.received), "hello") << with.received;
}

TEST_F(HttpsTest, ABadCertificateIsRefusedAtStart) {
  HttpServerOptions o = Tls(false);
  o.tls->key_pem = "not a key";
  auto s = HttpServer::Start(o, Echo());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("TLS key"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace krause::server
