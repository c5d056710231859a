// An event-driven HTTP/1.1 server (Boost.Beast over Asio, Debian's libboost-dev): a fixed, small
// number of event-loop threads holds every connection, idle, being read, waiting for its answer or
// streaming one, so that thousands of idle or streaming clients cost memory, not threads. The
// limits are enforced here, before a handler sees a request:
//   - headers not read within header_timeout_ms: 408, then the connection is closed;
//   - a body not read within body_timeout_ms: 408;
//   - headers over max_header_bytes: 431; a body over max_body_bytes: 413 as soon as its
//     Content-Length says so (before it is read), or once a chunked body passes the limit;
//   - a kept-alive connection idle for idle_timeout_ms is closed;
//   - a write that does not complete within write_timeout_ms (a client that stops reading)
//     drops the connection.
// A handler runs on a loop thread and must not block: it keeps the HttpExchange and answers
// through it, from any thread, whenever the answer is ready (Reply), or streams one (StartStream,
// Send, End). While a request waits for its answer the connection is watched: a client that
// closes it makes the exchange Gone() and runs the exchange's on-gone action once, on a loop
// thread, so that the caller can cancel the work.
// Thread-safety: an HttpExchange's methods may be called from any thread; Start and the
// destructor from one thread. After the destructor returns no handler or on-gone action runs,
// and exchanges that outlive the server do nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace krause::server {

// HTTPS: PEM texts. With a client CA, a client must present a certificate it signed.
struct HttpTls {
  std::string cert_pem, key_pem;
  std::string client_ca_pem;  // empty: no client certificate asked
};

// A request the server answered itself with an error, before any handler saw it.
struct HttpRefusal {
  int status = 0;      // 408, 413, 431 or 400
  std::string why;     // the error's text, as the client read it
  std::string peer;    // as HttpRequest::peer
  std::string method;  // "" when the headers were not read
  std::string target;  // the same
};

struct HttpServerOptions {
  // "host:port" (port 0: any free port; host empty or 0.0.0.0: every IPv4 interface; [::1]:p
  // for IPv6).
  std::string address = "0.0.0.0:8000";
  int threads = 2;                    // event-loop threads
  std::string thread_name = "http";   // their name (top -H, /proc/PID/task/*/comm; 15 chars)
  int header_timeout_ms = 5000;       // to read a request's headers
  int body_timeout_ms = 5000;         // to read its body
  int idle_timeout_ms = 2000;         // a kept-alive connection with no request
  int write_timeout_ms = 10000;       // to write one answer, or one piece of a stream
  int max_header_bytes = 16 << 10;    // the request line and headers
  int64_t max_body_bytes = 64 << 20;  // a request's body
  // Set: every connection is HTTPS (TLS 1.2 or later); a client that does not shake hands within
  // header_timeout_ms, or sends plain HTTP, is closed without an answer.
  std::optional<HttpTls> tls;
  // Told of every refusal (on a loop thread; it must not block), so that the refused requests
  // are counted and logged like the others. May be empty.
  std::function<void(const HttpRefusal&)> on_refused;

  // One request timeout for reading the headers, reading the body and writing an answer (what
  // the front ends' --http_timeout_ms means), and how long a kept-alive connection may idle.
  static HttpServerOptions WithTimeouts(std::string address, int threads, int request_timeout_ms,
                                        int idle_timeout_ms) {
    HttpServerOptions o;
    o.address = std::move(address);
    o.threads = threads;
    o.header_timeout_ms = o.body_timeout_ms = o.write_timeout_ms = request_timeout_ms;
    o.idle_timeout_ms = idle_timeout_ms;
    return o;
  }
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// A streamed answer's keep-alive: `piece` is written whenever the stream has had nothing to
// write for `interval_ms` (a Server-Sent Events comment, so that proxies keep it open).
struct StreamKeepAlive {
  std::string piece;
  int interval_ms = 0;  // 0: none
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, as sent
  int version = 11;    // 10 or 11
  HttpHeaders headers;
  std::string body;
  std::string peer;  // the client, as gRPC names peers: "ipv4:1.2.3.4:5", "ipv6:[::1]:5"
  // The first header of that name (case-insensitive), or "".
  std::string_view Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  HttpHeaders headers;  // Content-Length is set from the body
  std::string body;
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // The whole answer. Only the first of Reply/StartStream counts; later calls do nothing.
  virtual void Reply(HttpResponse response) = 0;
  // A streamed answer: the status and headers now (Transfer-Encoding: chunked on HTTP/1.1; on
  // HTTP/1.0 the body runs to the connection's end), then the body in pieces, then End().
  virtual void StartStream(int status, HttpHeaders headers, StreamKeepAlive keep_alive = {}) = 0;
  virtual void Send(std::string piece) = 0;
  virtual void End() = 0;
  // Bytes handed to Send that the client has not yet taken (a slow reader's backlog).
  virtual int64_t Backlog() const = 0;
  // The client has gone (closed the connection, or it was dropped); anything sent is dropped.
  virtual bool Gone() const = 0;
  // Runs `action` once, on a loop thread, when the client goes before the answer ends (at once,
  // on a loop thread, if it has gone already). Set it at most once.
  virtual void OnGone(std::function<void()> action) = 0;
};

using HttpHandler =
    std::function<void(HttpRequest request, std::shared_ptr<HttpExchange> exchange)>;

class HttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();  // closes every connection and joins the loop threads
  int port() const;
  // Connections open now (for tests and metrics).
  int64_t open_connections() const;

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace krause::server
