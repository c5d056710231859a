// A REST call's reply, shared by the REST handlers (oip_http.cc) and the HTTP generation
// (oip_generate.cc): an HttpCall (the caller's X-Request-Id and traceparent echoed, its entry
// through the gate), a success body, or an error as {"error": ...} with the HTTP status of its
// code.
// Thread-safety: one call's reply is used by one thread at a time.
#pragma once

#include <grpcpp/support/status.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "server/edge/call_book.h"
#include "server/edge/http_call.h"
#include "server/edge/http_server.h"
#include "server/edge/status.h"
#include "server/oip/oip_json.h"

namespace krause::server {

inline void SendJson(HttpExchange* ex, int status, std::string body, HttpHeaders headers = {},
                     const char* content_type = "application/json") {
  headers.emplace_back("Content-Type", content_type);
  ex->Reply({status, std::move(headers), std::move(body)});
}

// One REST call, as CallBook sees it: Finish(status) writes the reply (the success body set
// before, or {"error": ...} with the code's HTTP status, or `override_status` when set).
class RestReply : public HttpCall {
 public:
  using HttpCall::HttpCall;
  void Finish(const grpc::Status& st) {
    if (st.ok()) {
      HttpHeaders headers = echo();
      headers.insert(headers.end(), ok_headers_.begin(), ok_headers_.end());
      SendJson(exchange(), 200, std::move(ok_body_), std::move(headers), ok_content_type_);
      return;
    }
    HttpHeaders headers = ErrorHeaders(st.error_code());
    const int http = override_status_ != 0 ? override_status_ : HttpStatus(st.error_code());
    SendJson(exchange(), http, oip::ErrorJson(st.error_message()), std::move(headers));
  }
  std::string ok_body_;
  HttpHeaders ok_headers_;                            // with the success body
  const char* ok_content_type_ = "application/json";  // the success body's
  int override_status_ = 0;
};

}  // namespace krause::server
