// The Open Inference Protocol's REST API (KServe v2 over HTTP/1.1 and JSON) on its own port, on
// the event-driven HTTP server (server/edge/http_server.h), over the same models, gate, batches,
// request log and metrics (protocol oip-rest) as the gRPC services:
//   GET  /v2/health/live, /v2/health/ready          probes (no token, not counted)
//   GET  /v2                                        server metadata
//   GET  /v2/models/{name}[/versions/{v}]           model metadata
//   GET  /v2/models/{name}[/versions/{v}]/ready     a probe
//   POST /v2/models/{name}[/versions/{v}]/infer     an inference (oip_json.h, oip_infer.h)
//   GET  /v2/models[/{name}[/versions/{v}]]/stats   the statistics extension (oip_statistics.h)
//   POST /v2/repository/index, /v2/repository/models/{name}/load, .../unload
//                                                   model control (oip_repository.h; admin)
//   POST /v2/models/{name}[/versions/{v}]/generate_stream, /generate
//                                                   a generation over Server-Sent Events, or
//                                                   answered once (oip_generate.h)
// Errors are {"error": "..."} with the HTTP status of the call's code (status.h: 400, 401, 403,
// 404, 503, ...); the HTTP server itself answers a body over the limit with 413 before it is
// read, and a request that does not arrive within the request timeout with 408. A few loop
// threads (`threads`) hold every connection; no thread waits for an inference: the core's
// answer finishes the call. A client that goes away cancels its call (a generation's slots are
// freed at the next decode step). Each inference has a deadline: its `timeout` parameter, else
// `deadline_ms`.
// Thread-safety: handlers run on the loop threads; answers are written from the core's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/edge/front_end.h"
#include "server/edge/http_server.h"

namespace krause::server {

struct OipHttpOptions {
  std::string address = "0.0.0.0:8000";  // host:port (port 0: any free port)
  int threads = 2;                       // event-loop threads (they hold every connection)
  int request_timeout_ms = 5000;         // to read a request's headers, its body, to write
  int keep_alive_timeout_ms = 2000;      // an idle kept-alive connection is closed after this
  int64_t max_body_bytes = 64 << 20;     // larger bodies: 413
  int64_t deadline_ms = 600000;          // an inference's deadline (0: none) unless it sets one
  int stream_ping_ms = 15000;            // a `: ping` comment on a generate_stream this idle
  std::optional<HttpTls> tls;            // set: HTTPS only
  // The other routes on this port (krause.v1 over Connect, the web page), tried before the
  // protocol's: true when it answered the request. May be empty. Runs on the loop threads.
  std::function<bool(const HttpRequest&, const std::shared_ptr<HttpExchange>&)> other_routes;
};

class OipHttp {
 public:
  // `edge` (the gate, observer, request log, reply pool, fault hook) must outlive this object.
  static absl::StatusOr<std::unique_ptr<OipHttp>> Start(const OipHttpOptions& options,
                                                        const FrontEndContext* edge);
  ~OipHttp();  // closes every connection and joins the loop threads
  int port() const;

 private:
  class Handler;
  OipHttp() = default;
  std::unique_ptr<Handler> handler_;  // outlives server_
  std::unique_ptr<HttpServer> server_;
};

}  // namespace krause::server
