// The HTTP port's front door: the server owns it (KrauseServer), not any protocol. It holds the
// HTTP server (http_server.h: its limits, TLS) and routes each request by its path to the front
// end that registered the path, the way gRPC services are registered on a gRPC server:
//   /v2 ...                                  the Open Inference Protocol's REST (oip/oip_http.h)
//   /v2/models/{m}[/versions/{v}]/generate[_stream]
//                                            krause.v1's generation over HTTP
//                                            (v1/http_generation.h)
//   /krause.v1.KrauseService/ ...            krause.v1 over Connect (v1/connect_http.h)
//   /, /ui/ ...                              the web page (web/web_ui.h)
// The route with the longest matching prefix wins (a route that names its paths' last segments
// matches only those). A path no route takes is 404. A request the HTTP server answered itself
// (408, 413, 431, 400) is counted and logged under the protocol of the route its path belongs
// to, as the call that route says the path is.
// Thread-safety: routes are fixed at Start; handlers run on the loop threads, concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/edge/front_end.h"
#include "server/edge/http_route.h"
#include "server/edge/http_server.h"

namespace krause::server {

struct HttpFrontDoorOptions {
  std::string address = "0.0.0.0:8000";  // host:port (port 0: any free port)
  int threads = 2;                       // event-loop threads (they hold every connection)
  int request_timeout_ms = 5000;         // to read a request's headers, its body, to write
  int keep_alive_timeout_ms = 2000;      // an idle kept-alive connection is closed after this
  int64_t max_body_bytes = 64 << 20;     // larger bodies: 413
  std::optional<HttpTls> tls;            // set: HTTPS only
  std::string not_found_hint;            // added to a 404's message (where the APIs are)
};

class HttpFrontDoor {
 public:
  // `edge` (gate, observer, request log) and every route's handler must outlive this object.
  static absl::StatusOr<std::unique_ptr<HttpFrontDoor>> Start(const HttpFrontDoorOptions& options,
                                                              std::vector<HttpRoute> routes,
                                                              const FrontEndContext* edge);
  ~HttpFrontDoor();  // closes every connection and joins the loop threads
  int port() const;

  // The route that takes `path` (no query), or null (tests; the router itself).
  const HttpRoute* RouteOf(std::string_view path) const;

 private:
  HttpFrontDoor() = default;
  void Serve(HttpRequest request, std::shared_ptr<HttpExchange> exchange) const;
  void Refused(const HttpRefusal& refusal) const;

  HttpFrontDoorOptions options_;
  std::vector<HttpRoute> routes_;
  const FrontEndContext* edge_ = nullptr;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace krause::server
