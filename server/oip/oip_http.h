// The Open Inference Protocol's REST API (KServe v2 over HTTP/1.1 and JSON), a route on the
// server's HTTP front door (edge/http_front_door.h), over the same models, gate, batches,
// request log and metrics (protocol oip-rest) as the gRPC services:
//   GET  /v2/health/live, /v2/health/ready          probes (no token, not counted)
//   GET  /v2                                        server metadata
//   GET  /v2/models/{name}[/versions/{v}]           model metadata
//   GET  /v2/models/{name}[/versions/{v}]/ready     a probe
//   POST /v2/models/{name}[/versions/{v}]/infer     an inference (oip_json.h, oip_infer.h)
//   GET  /v2/models[/{name}[/versions/{v}]]/stats   the statistics extension (oip_statistics.h)
//   POST /v2/repository/index, /v2/repository/models/{name}/load, .../unload
//                                                   model control (oip_repository.h; admin)
// (krause.v1's generation over HTTP, /v2/models/{name}/generate[_stream], is its own route:
// v1/http_generation.h.) Errors are {"error": "..."} with the HTTP status of the call's code
// (status.h: 400, 401, 403, 404, 503, ...). No thread waits for an inference: the core's answer
// finishes the call. A client that goes away cancels its call. Each inference has a deadline: its
// `timeout` parameter, else `deadline_ms`.
// Thread-safety: the route's handler runs on the loop threads; answers are written from the
// core's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/edge/front_end.h"
#include "server/edge/http_front_door.h"

namespace krause::server {

struct OipRestOptions {
  int64_t deadline_ms = 600000;  // an inference's deadline (0: none) unless it sets one
};

class OipRest {
 public:
  // `edge` (the gate, registry, observer, request log, reply pool, fault hook) must outlive this
  // object, and this object the front door its route is on.
  OipRest(const OipRestOptions& options, const FrontEndContext* edge);
  ~OipRest();
  HttpRoute Route() const;  // the paths under /v2

 private:
  class Handler;
  std::unique_ptr<Handler> handler_;
};

}  // namespace krause::server
