#include "server/edge/http_front_door.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/edge/call_book.h"
#include "server/edge/http_call.h"

namespace krause::server {
namespace {

// The path's last segment ("" for a path ending in '/').
std::string_view LastSegment(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpFrontDoor>> HttpFrontDoor::Start(
    const HttpFrontDoorOptions& options, std::vector<HttpRoute> routes,
    const FrontEndContext* edge) {
  if (options.request_timeout_ms < 1 || options.keep_alive_timeout_ms < 1)
    return absl::InvalidArgumentError("the HTTP timeouts must be at least 1 ms");
  std::unique_ptr<HttpFrontDoor> d(new HttpFrontDoor());
  d->options_ = options;
  d->routes_ = std::move(routes);
  d->edge_ = edge;
  HttpServerOptions so = HttpServerOptions::WithTimeouts(
      options.address, options.threads, options.request_timeout_ms, options.keep_alive_timeout_ms);
  so.max_body_bytes = options.max_body_bytes;
  so.tls = options.tls;
  so.thread_name = "krause-http";
  const HttpFrontDoor* door = d.get();
  so.on_refused = [door](const HttpRefusal& r) { door->Refused(r); };
  auto server = HttpServer::Start(so, [door](HttpRequest r, std::shared_ptr<HttpExchange> ex) {
    door->Serve(std::move(r), std::move(ex));
  });
  if (!server.ok()) return server.status();
  d->server_ = std::move(*server);
  return d;
}

HttpFrontDoor::~HttpFrontDoor() { server_.reset(); }  // no handler runs after this

int HttpFrontDoor::port() const { return server_->port(); }

const HttpRoute* HttpFrontDoor::RouteOf(std::string_view path) const {
  const HttpRoute* best = nullptr;
  for (const HttpRoute& r : routes_) {
    if (r.exact ? path != r.prefix : path.substr(0, r.prefix.size()) != r.prefix) continue;
    if (!r.last_segments.empty()) {
      const std::string_view last = LastSegment(path);
      bool named = false;
      for (const std::string& s : r.last_segments) named = named || last == s;
      if (!named) continue;
    }
    if (best == nullptr || r.prefix.size() > best->prefix.size()) best = &r;
  }
  return best;
}

void HttpFrontDoor::Serve(HttpRequest request, std::shared_ptr<HttpExchange> ex) const {
  const std::string_view target = request.target;
  const std::string_view path = target.substr(0, target.find('?'));
  if (const HttpRoute* r = RouteOf(path)) return r->handler(std::move(request), std::move(ex));
  SendJson(ex.get(), 404,
           ErrorJson(absl::StrCat("no such path: ", std::string(path.substr(0, 128)),
                                  options_.not_found_hint)));
}

void HttpFrontDoor::Refused(const HttpRefusal& r) const {
  const std::string_view path = std::string_view(r.target).substr(0, r.target.find('?'));
  const HttpRoute* route = r.target.empty() ? nullptr : RouteOf(path);
  const char* rpc = route != nullptr && route->rpc ? route->rpc(path) : nullptr;
  CallBook book(edge_->gate, edge_->observer, edge_->request_log, rpc != nullptr ? rpc : "HTTP",
                route != nullptr ? route->protocol : kProtocolHttp);
  book.NoteRefused(r.peer);
  const absl::Status st = r.status == 408   ? absl::DeadlineExceededError(r.why)
                          : r.status == 400 ? absl::InvalidArgumentError(r.why)
                                            : absl::ResourceExhaustedError(r.why);  // 413, 431
  book.Finish(st, [](const absl::Status&) {});  // the HTTP server has answered already
}

}  // namespace krause::server
