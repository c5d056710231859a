// A civetweb server (Debian's libcivetweb, the server prometheus-cpp's own Exposer uses)
// listening on one "host:port", for the server's HTTP endpoints (/metrics: http_endpoint.h; the
// Open Inference Protocol's REST API: oip_http.h). Start() resolves the address and starts the
// listener and its worker threads; the destructor stops them promptly (civetweb's accept loop
// otherwise notices a stop only every 2 s) and joins every worker, so that no handler runs after
// it. Also here: the fix that lets civetweb start threads at all inside this process (see the
// .cc).
// Thread-safety: handlers run on civetweb's workers; Start and the destructor on one thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

class CivetServer;

namespace krause::server {

class CivetHost {
 public:
  // `address`: "host:port" (port 0: any free port; host empty or 0.0.0.0: every IPv4 interface;
  // [::1]:p for IPv6). `options`: civetweb's options besides listening_ports, as name, value
  // pairs.
  static absl::StatusOr<std::unique_ptr<CivetHost>> Start(const std::string& address,
                                                          std::vector<std::string> options);
  ~CivetHost();
  CivetServer* server() const { return server_.get(); }
  int port() const { return port_; }

 private:
  CivetHost() = default;
  std::unique_ptr<CivetServer> server_;
  int port_ = 0;
  std::string wake_host_;  // where a local connection reaches the listener (close)
  int wake_family_ = 0;
};

}  // namespace krause::server
