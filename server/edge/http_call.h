// What every counted HTTP call shares, whichever protocol it speaks (the Open Inference
// Protocol's REST, oip/rest_reply.h; krause.v1 over Connect, v1/connect_http.h): the exchange it
// answers through, the caller's X-Request-Id and traceparent (echoed on the answer, written to
// the request log), and its entry through the gate with its bearer token.
// Thread-safety: one call's object is used by one thread at a time.
#pragma once

#include <grpcpp/support/status_code_enum.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "server/edge/call_book.h"
#include "server/edge/http_server.h"

namespace krause::server {

class HttpCall {
 public:
  HttpCall(const HttpRequest& request, std::shared_ptr<HttpExchange> exchange)
      : exchange_(std::move(exchange)) {
    for (const char* key : {"X-Request-Id", "traceparent"}) {
      std::string v(request.Header(key).substr(0, 256));
      if (!v.empty()) echo_.emplace_back(key, std::move(v));
    }
  }
  std::string request_id() const { return Echoed('X'); }
  std::string traceparent() const { return Echoed('t'); }
  HttpExchange* exchange() const { return exchange_.get(); }
  // The headers every answer of the call carries (the echoed ids).
  const HttpHeaders& echo() const { return echo_; }
  // An error answer's headers: the echoed ids and, for a missing or unknown token,
  // WWW-Authenticate: Bearer.
  HttpHeaders ErrorHeaders(grpc::StatusCode code) const {
    HttpHeaders headers = echo_;
    if (code == grpc::StatusCode::UNAUTHENTICATED)
      headers.emplace_back("WWW-Authenticate", "Bearer");
    return headers;
  }

  // Enters the gate: the request's bearer token (an admin token for model control), the ids it
  // echoes, its peer.
  absl::Status Enter(CallBook& book, const HttpRequest& request, bool admin = false) const {
    std::optional<std::string_view> authorization;
    const std::string_view auth = request.Header("Authorization");
    if (!auth.empty()) authorization = auth;
    return book.Enter(authorization, request_id(), traceparent(), request.peer, admin);
  }

 private:
  std::string Echoed(char first) const {
    for (const auto& [k, v] : echo_)
      if (k[0] == first) return v;
    return "";
  }

  std::shared_ptr<HttpExchange> exchange_;
  HttpHeaders echo_;
};

}  // namespace krause::server
