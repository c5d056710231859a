#include "server/http_endpoint.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace krause::server {

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& address, std::string path, std::string content_type,
    std::function<std::string()> body) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("address must be host:port, got ", address));
  std::string host = address.substr(0, colon);
  if (!host.empty() && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", address));
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint());
  std::string error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      e->listen_fd_ = fd;
      break;
    }
    error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  if (e->listen_fd_ < 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", error));
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(e->listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  e->port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (pipe(e->wake_) != 0) return absl::InternalError("pipe failed");
  e->path_ = std::move(path);
  e->content_type_ = std::move(content_type);
  e->body_ = std::move(body);
  HttpEndpoint* raw = e.get();
  e->thread_ = std::thread([raw] { raw->Loop(); });
  return e;
}

HttpEndpoint::~HttpEndpoint() {
  if (thread_.joinable()) {
    const char b = 0;
    [[maybe_unused]] ssize_t n = write(wake_[1], &b, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) close(fd);
}

void HttpEndpoint::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (fds[0].revents & POLLIN) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        Serve(fd);
        close(fd);
      }
    }
  }
}

void HttpEndpoint::Serve(int fd) {
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  // Read the request head (up to a blank line or 8 KiB).
  std::string req;
  char buf[2048];
  while (req.size() < 8192 && req.find("\r\n\r\n") == std::string::npos &&
         req.find("\n\n") == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  const std::string line = req.substr(0, req.find_first_of("\r\n"));
  std::string target;
  if (line.rfind("GET ", 0) == 0) {
    const size_t end = line.find(' ', 4);
    target = line.substr(4, end == std::string::npos ? std::string::npos : end - 4);
    target = target.substr(0, target.find('?'));
  }
  std::string status = "200 OK", type = content_type_, body;
  if (target == path_) {
    body = body_();
  } else {
    status = "404 Not Found";
    type = "text/plain";
    body = absl::StrCat("only GET ", path_, " is served here\n");
  }
  const std::string resp =
      absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
  size_t sent = 0;
  while (sent < resp.size()) {
    const ssize_t n = send(fd, resp.data() + sent, resp.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
}

}  // namespace krause::server
