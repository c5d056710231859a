// The web page on the HTTP port (docs/web.md), routes of the HTTP front door
// (edge/http_front_door.h): GET / answers page/index.html and GET /ui/{file} the page's other
// files, compiled into the binary (web_assets.h), so that the page works with the server offline.
// The page itself holds no secret and needs no token; it reaches the server only through the public
// APIs on the same port (krause.v1 over Connect, the Open Inference Protocol's REST and
// generate_stream), sending the token the user gives it. Each answer has an ETag (a hash of the
// file: If-None-Match gets 304) and a Content-Security-Policy that allows nothing from elsewhere.
// Thread-safety: Serve runs on the HTTP loop threads, concurrently (the files are constant).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/edge/http_route.h"

namespace krause::server {

class WebUi {
 public:
  WebUi();
  // A request for / or /ui/...: answered (405 for anything but GET, 404 for a file the page has
  // not), true. Any other request: nothing done, false.
  bool Serve(const HttpRequest& request, const std::shared_ptr<HttpExchange>& exchange) const;

  // The routes of /, /index.html and /ui/... on the HTTP front door; this object must outlive it.
  std::vector<HttpRoute> Routes() const;

  // The page's size in bytes (all its files), for the log.
  size_t bytes() const;

 private:
  struct File {
    std::string name, content_type, etag;
    const unsigned char* data;
    size_t size;
  };
  std::vector<File> files_;
};

}  // namespace krause::server
