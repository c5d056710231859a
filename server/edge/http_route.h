// One route of the HTTP front door (http_front_door.h): the paths a front end takes, the protocol
// its calls are counted under, and its handler. Apart from the front door so that a front end
// that only serves files (the web page) registers routes without the serving core's headers.
// Thread-safety: a plain value; the handler runs on the HTTP loop threads.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "server/edge/http_server.h"

namespace krause::server {

struct HttpRoute {
  std::string prefix;  // the path starts with it
  bool exact = false;  // the path is the prefix itself
  // Non-empty: the path's last segment must be one of these (e.g. "generate").
  std::vector<std::string> last_segments;
  const char* protocol = "http";  // the call's protocol label (call_book.h's kProtocol*)
  // The call a refused request of the path was for ("HTTP" when empty or it returns null).
  std::function<const char*(std::string_view path)> rpc;
  HttpHandler handler;  // runs on a loop thread; must not block
};

}  // namespace krause::server
