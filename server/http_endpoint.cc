#include "server/http_endpoint.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

// Why prometheus-cpp's Exposer (civetweb) failed to start inside this server ("null context",
// from civetweb's "Cannot create threads: error 0"): civetweb creates its threads with a fixed
// 100 KiB stack (pthread_attr_setstacksize), and glibc places a thread's static TLS on its stack,
// refusing the thread (EINVAL, errno untouched) when the TLS does not fit. This process's static
// TLS is ~103 KiB (OpenBLAS 60 KiB, glog 30 KiB, LibTorch 10 KiB, ...). A standalone program
// without those libraries starts it fine. The fix: this executable's definition of
// pthread_attr_setstacksize (it takes precedence over libc's for every library) raises a request
// below 1 MiB to 1 MiB (address space only; glibc's default is 8 MiB), then calls libc's.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinStack = size_t{1} << 20;
  if (real == nullptr) return ENOSYS;
  return real(attr, size < kMinStack ? kMinStack : size);
}

namespace krause::server {
namespace {

// civetweb reports why mg_start failed only through the log callback, on the starting thread.
thread_local std::string g_start_error;

int LogMessage(const mg_connection*, const char* message) {
  g_start_error = message;
  return 1;  // handled: nothing on stderr
}

struct Listen {
  std::string ports;      // civetweb's listening_ports
  std::string wake_host;  // numeric address a local connect reaches it at
  int family = AF_INET;
};

// "host:port" as civetweb's listening_ports wants it: a numeric address (host names resolved
// here), "[v6]:port" for IPv6, the bare port for every IPv4 interface.
absl::StatusOr<Listen> ListeningPorts(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("address must be host:port, got ", address));
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("address must be host:port, got ", address));
  if (!host.empty() && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0") return Listen{port, "127.0.0.1", AF_INET};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", address));
  char text[INET6_ADDRSTRLEN] = {0};
  Listen out;
  out.family = res->ai_family;
  if (res->ai_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr, text,
              sizeof(text));
    out.ports = absl::StrCat("[", text, "]:", port);
  } else {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, text, sizeof(text));
    out.ports = absl::StrCat(text, ":", port);
  }
  out.wake_host = text;
  freeaddrinfo(res);
  return out;
}

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
  auto ports = ListeningPorts(options.address);
  if (!ports.ok()) return ports.status();
  if (options.threads < 1 || options.request_timeout_ms < 1)
    return absl::InvalidArgumentError("HTTP endpoint: threads and request_timeout_ms must be >= 1");
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint());
  e->options_ = std::move(options);
  e->wake_host_ = ports->wake_host;
  e->wake_family_ = ports->family;
  const std::vector<std::string> civet = {
      "listening_ports",    ports->ports,
      "num_threads",        std::to_string(e->options_.threads),
      "request_timeout_ms", std::to_string(e->options_.request_timeout_ms),
      "enable_keep_alive",  "no",
  };
  CivetCallbacks callbacks;
  callbacks.log_message = LogMessage;
  g_start_error.clear();
  try {
    e->server_ = std::make_unique<CivetServer>(civet, &callbacks);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", e->options_.address, ": ",
                                               g_start_error.empty() ? ex.what() : g_start_error));
  }
  const std::vector<int> bound = e->server_->getListeningPorts();
  if (bound.empty())
    return absl::UnavailableError(absl::StrCat("cannot listen on ", e->options_.address));
  e->port_ = bound[0];
  e->handler_ = std::make_unique<Handler>(&e->options_);
  e->server_->addHandler(e->options_.path, e->handler_.get());
  return e;
}

HttpEndpoint::~HttpEndpoint() {
  if (!server_) return;
  // civetweb's accept loop notices a stop only when its poll returns (every 2 s when idle), so
  // that close() would take up to 2 s: connections to the port make it return at once.
  std::atomic<bool> closed{false};
  std::thread waker([&] {
    while (!closed.load()) {
      const int fd = socket(wake_family_, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        if (wake_family_ == AF_INET6) {
          sockaddr_in6 a{};
          a.sin6_family = AF_INET6;
          a.sin6_port = htons(static_cast<uint16_t>(port_));
          inet_pton(AF_INET6, wake_host_.c_str(), &a.sin6_addr);
          connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        } else {
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_port = htons(static_cast<uint16_t>(port_));
          inet_pton(AF_INET, wake_host_.c_str(), &a.sin_addr);
          connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        }
        close(fd);
      }
      for (int i = 0; i < 10 && !closed.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  server_->close();  // joins the workers: no handler runs after this
  closed = true;
  waker.join();
}

}  // namespace krause::server
