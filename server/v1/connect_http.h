// krause.v1's unary methods over HTTP, with the Connect protocol's unary calls
// (connectrpc.com/docs/protocol), a route on the HTTP front door (edge/http_front_door.h) beside
// the Open Inference Protocol: a browser,
// curl or `buf curl --protocol connect` reaches the same calls as gRPC without a gRPC stack.
//   POST /krause.v1.KrauseService/{ListModels, GetModel, Classify, Score, Inspect}
//   Content-Type: application/json (protobuf's JSON mapping: lowerCamelCase names, bytes as
//     base64, 64-bit integers as strings; unknown fields are refused) or application/proto
//   Connect-Timeout-Ms: the call's deadline (else the REST port's default)
//   Authorization: Bearer <token>, as every call with --auth_tokens
// Success: 200 with the response in the request's codec. An error: the HTTP status of its code
// (edge/status.h's table, the protocol's) and, always as JSON,
//   {"code": "invalid_argument", "message": "...",
//    "details": [{"type": "google.rpc.BadRequest", "value": "<the message, base64>"}]}
// The calls run unary.h's functions, as the gRPC service does, through the same gate, request log
// and metrics (protocol "krause.v1-connect"). Generate (a server stream) is served over HTTP by
// /v2/models/{m}/generate_stream (http_generation.h); model control by the repository extension.
// Thread-safety: Serve runs on the HTTP loop threads; answers are written from the core's.
#pragma once

#include <cstdint>
#include <memory>

#include "server/edge/front_end.h"
#include "server/edge/http_front_door.h"

namespace krause::server {

class ConnectHttp {
 public:
  // `edge` must outlive this object; `deadline_ms` (0: none) is a call's deadline when it sets
  // none.
  ConnectHttp(const FrontEndContext* edge, int64_t deadline_ms)
      : edge_(edge), deadline_ms_(deadline_ms) {}

  // The path prefix of the calls served here.
  static constexpr char kPrefix[] = "/krause.v1.KrauseService/";

  // The route of the paths under kPrefix; this object must outlive the front door.
  HttpRoute Route() const;

 private:
  // A request whose path starts with kPrefix: answered now, or when its work is done.
  void Serve(const HttpRequest& request, const std::shared_ptr<HttpExchange>& exchange) const;

  const FrontEndContext* const edge_;
  const int64_t deadline_ms_;
};

}  // namespace krause::server
