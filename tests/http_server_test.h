// The HTTP server tests' client side (http_server_test.cc, http_server_tls_test.cc): a plain
// blocking client over loopback sockets (connect, send, read until a condition or the close, a
// response's body, a chunked body decoded), waits for a condition with a cap, and a server on a
// loopback port with an echo handler.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "server/edge/http_server.h"

namespace krause::server::http_testing {

using Clock = std::chrono::steady_clock;

inline int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

inline void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    sent += static_cast<size_t>(n);
  }
}

// Reads until `done(text)` holds, the peer closes, or 20 s pass; returns what was read.
template <typename Done>
inline std::string ReadUntil(int fd, Done done, bool* closed = nullptr) {
  std::string text;
  const auto end = Clock::now() + std::chrono::seconds(20);
  if (closed) *closed = false;
  while (!done(text) && Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (closed) *closed = true;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

// One whole response with a Content-Length body.
inline std::string ReadResponse(int fd) {
  return ReadUntil(fd, [](const std::string& t) {
    const size_t head = t.find("\r\n\r\n");
    if (head == std::string::npos) return false;
    const size_t at = t.find("Content-Length: ");
    if (at == std::string::npos || at > head) return true;
    return t.size() >= head + 4 + std::stoul(t.substr(at + 16));
  });
}

inline std::string Body(const std::string& response) {
  const size_t head = response.find("\r\n\r\n");
  return head == std::string::npos ? "" : response.substr(head + 4);
}

// Decodes a chunked body (after the head); "" with *complete false if it has not ended.
inline std::string Dechunk(const std::string& body, bool* complete) {
  std::string out;
  size_t at = 0;
  *complete = false;
  while (true) {
    const size_t eol = body.find("\r\n", at);
    if (eol == std::string::npos) return out;
    const size_t size = std::stoul(body.substr(at, eol - at), nullptr, 16);
    if (size == 0) {
      *complete = body.size() >= eol + 4;
      return out;
    }
    if (body.size() < eol + 2 + size + 2) return out;
    out += body.substr(eol + 2, size);
    at = eol + 2 + size + 2;
  }
}

inline bool WaitFor(const std::function<bool()>& cond) {
  const auto end = Clock::now() + std::chrono::seconds(20);
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline HttpServerOptions Loopback() {
  HttpServerOptions o;
  o.address = "127.0.0.1:0";
  o.threads = 2;
  return o;
}

inline std::unique_ptr<HttpServer> StartOrDie(const HttpServerOptions& o, HttpHandler h) {
  auto s = HttpServer::Start(o, std::move(h));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

inline HttpHandler Echo() {
  return [](HttpRequest r, std::shared_ptr<HttpExchange> ex) {
    ex->Reply({200, {{"Content-Type", "text/plain"}}, r.method + " " + r.target + " " + r.body});
  };
}

}  // namespace krause::server::http_testing
