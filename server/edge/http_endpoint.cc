#include "server/edge/http_endpoint.h"

#include <CivetServer.h>

#include <exception>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/edge/civet_host.h"

namespace krause::server {
namespace {

void Reply(mg_connection* conn, const char* status, const char* extra_headers,
           const std::string& content_type, const std::string& body, bool send_body) {
  mg_printf(conn,
            "HTTP/1.1 %s\r\n%sContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
            status, extra_headers, content_type.c_str(), body.size());
  if (send_body && !body.empty()) mg_write(conn, body.data(), body.size());
}

}  // namespace

class HttpEndpoint::Handler : public CivetHandler {
 public:
  explicit Handler(const HttpEndpointOptions* options) : o_(options) {}
  bool handleGet(CivetServer*, mg_connection* conn) override { return Serve(conn, true); }
  bool handleHead(CivetServer*, mg_connection* conn) override { return Serve(conn, false); }
  bool handlePost(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
  bool handlePut(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
  bool handleDelete(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }

 private:
  bool NotAllowed(mg_connection* conn) {
    Reply(conn, "405 Method Not Allowed", "Allow: GET, HEAD\r\n", "text/plain", "GET only\n", true);
    return true;
  }
  bool Authorized(mg_connection* conn) const {
    if (o_->tokens.empty()) return true;
    const char* h = mg_get_header(conn, "Authorization");
    if (h == nullptr) return false;
    const std::string value(h);
    constexpr char kBearer[] = "bearer ";
    return absl::StartsWithIgnoreCase(value, kBearer) &&
           o_->tokens.count(value.substr(sizeof(kBearer) - 1)) > 0;
  }
  bool Serve(mg_connection* conn, bool send_body) {
    if (!Authorized(conn)) {
      Reply(conn, "401 Unauthorized", "WWW-Authenticate: Bearer\r\n", "text/plain",
            "missing or invalid token: send \"Authorization: Bearer <token>\"\n", send_body);
      return true;
    }
    std::string body;
    try {
      body = o_->body();
    } catch (const std::exception& e) {
      Reply(conn, "500 Internal Server Error", "", "text/plain",
            absl::StrCat("metrics failed: ", e.what(), "\n"), send_body);
      return true;
    }
    Reply(conn, "200 OK", "", o_->content_type, body, send_body);
    return true;
  }

  const HttpEndpointOptions* const o_;
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options) {
  if (options.threads < 1 || options.request_timeout_ms < 1)
    return absl::InvalidArgumentError("HTTP endpoint: threads and request_timeout_ms must be >= 1");
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint());
  e->options_ = std::move(options);
  auto host =
      CivetHost::Start(e->options_.address,
                       {"num_threads", std::to_string(e->options_.threads), "request_timeout_ms",
                        std::to_string(e->options_.request_timeout_ms), "enable_keep_alive", "no"});
  if (!host.ok()) return host.status();
  e->host_ = std::move(*host);
  e->handler_ = std::make_unique<Handler>(&e->options_);
  e->host_->server()->addHandler(e->options_.path, e->handler_.get());
  return e;
}

HttpEndpoint::~HttpEndpoint() { host_.reset(); }  // before the handler: no request runs after

}  // namespace krause::server
