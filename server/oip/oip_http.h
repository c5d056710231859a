// The Open Inference Protocol's REST API (KServe v2 over HTTP/1.1 and JSON) on its own port, on
// civetweb (civet_host.h), over the same models, gate, batches, request log and metrics (protocol
// oip-rest) as the gRPC services:
//   GET  /v2/health/live, /v2/health/ready          probes (no token, not counted)
//   GET  /v2                                        server metadata
//   GET  /v2/models/{name}[/versions/{v}]           model metadata
//   GET  /v2/models/{name}[/versions/{v}]/ready     a probe
//   POST /v2/models/{name}[/versions/{v}]/infer     an inference (oip_json.h, oip_infer.h)
// Errors are {"error": "..."} with the HTTP status of the call's code (status.h: 400, 401, 403,
// 404, 503, ...); a body over the limit is 413 before it is read, one that does not arrive within
// the request timeout is 408. Each connection holds one of `threads` workers while it is read or
// answered (civetweb's model); an idle connection is closed after the request timeout (no request
// yet) or the keep-alive timeout (between requests), so idle clients cannot hold every worker for
// long. While the core works, the worker waits for its answer and watches the client's socket:
// a client that goes away cancels its call (a generation's slots are freed at the next decode
// step). Each inference has a deadline: its `timeout` parameter, else `deadline_ms`.
// Thread-safety: handlers run concurrently on civetweb's workers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/edge/civet_host.h"
#include "server/edge/front_end.h"

namespace krause::server {

struct OipHttpOptions {
  std::string address = "0.0.0.0:8000";  // host:port (port 0: any free port)
  int threads = 256;                     // connections served at once
  int request_timeout_ms = 5000;         // to read a request (headers and body) and to write
  int keep_alive_timeout_ms = 2000;      // an idle kept-alive connection is closed after this
  int64_t max_body_bytes = 64 << 20;     // larger bodies: 413
  int64_t deadline_ms = 600000;          // an inference's deadline (0: none) unless it sets one
};

class OipHttp {
 public:
  // `edge` (the gate, observer, request log, reply pool, fault hook) must outlive this object.
  static absl::StatusOr<std::unique_ptr<OipHttp>> Start(const OipHttpOptions& options,
                                                        const FrontEndContext* edge);
  ~OipHttp();  // stops the listener and joins its workers
  int port() const { return host_->port(); }

 private:
  class Handler;
  OipHttp() = default;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<CivetHost> host_;
};

}  // namespace krause::server
