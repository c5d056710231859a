// What every counted HTTP call shares, whichever protocol it speaks (the Open Inference
// Protocol's REST, oip/oip_http.h; krause.v1 over Connect, v1/connect_http.h, and its HTTP
// generation, v1/http_generation.h): the exchange it answers through, the caller's X-Request-Id
// and traceparent (echoed on the answer, written to the request log), and its entry through the
// gate with its bearer token. JsonReply: a call answered with a JSON body, or an error as
// {"error": "..."} with the HTTP status of its code (the REST APIs' shape).
// Thread-safety: one call's object is used by one thread at a time.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "server/edge/call_book.h"
#include "server/edge/http_server.h"
#include "server/edge/json_text.h"
#include "server/edge/status.h"

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
  HttpHeaders ErrorHeaders(absl::StatusCode code) const {
    HttpHeaders headers = echo_;
    if (code == absl::StatusCode::kUnauthenticated)
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

// Starts a call's answer as Server-Sent Events: 200, the echoed ids, no caching or proxy
// buffering, a `: ping` comment after `ping_ms` without events (so proxies keep it open).
inline void StartEventStream(const HttpCall& call, int ping_ms) {
  HttpHeaders headers = call.echo();
  headers.emplace_back("Content-Type", "text/event-stream");
  headers.emplace_back("Cache-Control", "no-cache");
  headers.emplace_back("X-Accel-Buffering", "no");
  call.exchange()->StartStream(200, std::move(headers), {": ping\n\n", ping_ms});
}

// After a piece of a stream was sent: whether the client keeps up. The HTTP server writes in
// order and drops a client that stops reading (its write timeout); one that reads too slowly
// for the stream (more than `max_backlog` bytes behind) is dropped by the caller.
inline bool KeepsUp(const HttpExchange& ex, int64_t max_backlog) {
  return !ex.Gone() && ex.Backlog() <= max_backlog;
}

// {"error": message}: the REST APIs' error body.
inline std::string ErrorJson(absl::string_view message) {
  nlohmann::json j;
  j["error"] = std::string(message);
  return JsonText(j);
}

inline void SendJson(HttpExchange* ex, int status, std::string body, HttpHeaders headers = {},
                     const char* content_type = "application/json") {
  headers.emplace_back("Content-Type", content_type);
  ex->Reply({status, std::move(headers), std::move(body)});
}

// One call answered with a JSON body: Finish(status) writes the reply (the success body set
// before, or the error body of the code's HTTP status: {"error": ...} unless the protocol sets
// its own, `error_body_`). An error for a client that has left is 499 (nobody reads it).
class JsonReply : public HttpCall {
 public:
  using HttpCall::HttpCall;
  using ErrorBody = std::string (*)(const absl::Status&);
  static std::string MessageError(const absl::Status& st) { return ErrorJson(st.message()); }

  void Finish(const absl::Status& st) {
    if (st.ok()) {
      HttpHeaders headers = echo();
      headers.insert(headers.end(), ok_headers_.begin(), ok_headers_.end());
      SendJson(exchange(), 200, std::move(ok_body_), std::move(headers), ok_content_type_);
      return;
    }
    const int http = exchange()->Gone() ? 499 : HttpStatus(st.code());
    SendJson(exchange(), http, error_body_(st), ErrorHeaders(st.code()));
  }
  std::string ok_body_;
  HttpHeaders ok_headers_;                            // with the success body
  const char* ok_content_type_ = "application/json";  // the success body's
  ErrorBody error_body_ = &MessageError;              // an error's body
};

}  // namespace krause::server
