// A minimal HTTP/1.0 endpoint serving one GET path (Prometheus /metrics): one thread accepting
// on a listening socket, one response per connection. Anything but GET of that path gets 404.
// Thread-safety: the body callback runs on the endpoint's thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace krause::server {

class HttpEndpoint {
 public:
  // address "host:port" (port 0: any free port; host empty or 0.0.0.0: every interface).
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& address,
                                                             std::string path,
                                                             std::string content_type,
                                                             std::function<std::string()> body);
  ~HttpEndpoint();
  int port() const { return port_; }

 private:
  HttpEndpoint() = default;
  void Loop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe that ends the accept loop
  int port_ = 0;
  std::string path_, content_type_;
  std::function<std::string()> body_;
  std::thread thread_;
};

}  // namespace krause::server
