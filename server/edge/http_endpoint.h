// The HTTP endpoint of one GET path (Prometheus /metrics), on the event-driven HTTP server
// (http_server.h): a few loop threads hold every connection, so that idle or slow clients cost
// memory, not the endpoint; a request's headers must arrive within `request_timeout_ms` (else
// 408). Optional bearer tokens. Anything but GET (or HEAD) of the path gets 404 / 405.
// Thread-safety: the body callback runs on the loop threads, concurrently.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "server/edge/http_server.h"

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
  int threads = 1;                // loop threads
  int request_timeout_ms = 2000;  // to read a request's headers (a slow client's limit)
};

class HttpEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(HttpEndpointOptions options);
  ~HttpEndpoint();
  int port() const;

 private:
  class Handler;
  HttpEndpoint() = default;

  HttpEndpointOptions options_;
  std::unique_ptr<Handler> handler_;  // outlives server_
  std::unique_ptr<HttpServer> server_;
};

}  // namespace krause::server
