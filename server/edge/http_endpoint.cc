#include "server/edge/http_endpoint.h"

#include <exception>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace krause::server {

class HttpEndpoint::Handler {
 public:
  explicit Handler(const HttpEndpointOptions* options) : o_(options) {}

  // On a loop thread (the body is made there: a scrape takes milliseconds).
  void Serve(const HttpRequest& request, HttpExchange* ex) const {
    const std::string path = request.target.substr(0, request.target.find('?'));
    if (path != o_->path) {
      ex->Reply({404, {{"Content-Type", "text/plain"}}, "not found: see " + o_->path + "\n"});
      return;
    }
    if (request.method != "GET" && request.method != "HEAD") {
      ex->Reply({405, {{"Allow", "GET, HEAD"}, {"Content-Type", "text/plain"}}, "GET only\n"});
      return;
    }
    if (!Authorized(request)) {
      ex->Reply({401,
                 {{"WWW-Authenticate", "Bearer"}, {"Content-Type", "text/plain"}},
                 "missing or invalid token: send \"Authorization: Bearer <token>\"\n"});
      return;
    }
    try {
      ex->Reply({200, {{"Content-Type", o_->content_type}}, o_->body()});
    } catch (const std::exception& e) {
      ex->Reply({500,
                 {{"Content-Type", "text/plain"}},
                 absl::StrCat("metrics failed: ", e.what(), "\n")});
    }
  }

 private:
  bool Authorized(const HttpRequest& request) const {
    if (o_->tokens.empty()) return true;
    const std::string value(request.Header("Authorization"));
    constexpr char kBearer[] = "bearer ";
    return absl::StartsWithIgnoreCase(value, kBearer) &&
           o_->tokens.count(value.substr(sizeof(kBearer) - 1)) > 0;
  }

  const HttpEndpointOptions* const o_;
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options) {
  if (options.threads < 1 || options.request_timeout_ms < 1)
    return absl::InvalidArgumentError("HTTP endpoint: threads and request_timeout_ms must be >= 1");
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint());
  e->options_ = std::move(options);
  e->handler_ = std::make_unique<Handler>(&e->options_);
  HttpServerOptions so = HttpServerOptions::WithTimeouts(e->options_.address, e->options_.threads,
                                                         e->options_.request_timeout_ms,
                                                         e->options_.request_timeout_ms);
  so.max_body_bytes = 1 << 16;  // a scrape has no body
  so.thread_name = "krause-metrics";
  const Handler* handler = e->handler_.get();
  auto server = HttpServer::Start(so, [handler](HttpRequest r, std::shared_ptr<HttpExchange> ex) {
    handler->Serve(r, ex.get());
  });
  if (!server.ok()) return server.status();
  e->server_ = std::move(*server);
  return e;
}

HttpEndpoint::~HttpEndpoint() { server_.reset(); }  // before the handler: no request runs after

int HttpEndpoint::port() const { return server_->port(); }

}  // namespace krause::server
