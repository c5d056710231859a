// The HTTP endpoint of one GET path (Prometheus /metrics), on civetweb (Debian's libcivetweb, the
// server prometheus-cpp's own Exposer uses): a pool of worker threads, so that one slow or idle
// client holds one thread, not the endpoint, and a bounded time to read a request's headers, so
// that it holds it for at most `request_timeout_ms`. Optional bearer tokens. Anything but GET (or
// HEAD) of the path gets 404 / 405.
// Thread-safety: the body callback runs on the endpoint's worker threads, concurrently.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "server/edge/civet_host.h"

namespace krause::server {

struct HttpEndpointOptions {
  // "host:port" (port 0: any free port; host empty or 0.0.0.0: every IPv4 interface; [::1]:p for
  // IPv6).
  std::string address;
  std::string path = "/metrics";
  std::string content_type = "text/plain; version=0.0.4";
  std::function<std::string()> body;
  // Non-empty: a request needs "Authorization: Bearer <one of these>" (the scheme in any case),
  // else 401.
  std::set<std::string> tokens;
  // Connections served at once. civetweb gives each open connection a worker until its request
  // is read (or request_timeout_ms passes), so this many idle or trickling clients are needed to
  // delay a scrape at all: 256 (address space 1 MiB each, a few KiB resident) keeps a scrape
  // answering at once beside 200 idle connections (server_hardening_test).
  int threads = 256;
  int request_timeout_ms = 2000;  // to read a request's headers (a slow client's limit)
};

class HttpEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(HttpEndpointOptions options);
  ~HttpEndpoint();
  int port() const { return host_->port(); }

 private:
  class Handler;
  HttpEndpoint() = default;

  HttpEndpointOptions options_;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<CivetHost> host_;
};

}  // namespace krause::server
