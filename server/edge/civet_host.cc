#include "server/edge/civet_host.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<CivetHost>> CivetHost::Start(const std::string& address,
                                                            std::vector<std::string> options) {
  auto ports = ListeningPorts(address);
  if (!ports.ok()) return ports.status();
  std::unique_ptr<CivetHost> h(new CivetHost());
  h->wake_host_ = ports->wake_host;
  h->wake_family_ = ports->family;
  // civetweb listens with a backlog of 200 and queues 20 accepted connections for its workers:
  // with 200 idle clients connected, a new one's SYN was dropped and retried by the client's
  // kernel a second later (a scrape beside 200 idle connections took 1.0 s under load). A backlog
  // and a queue as large as the worker pools (the kernel caps the backlog at somaxconn).
  options.insert(options.begin(), {"listening_ports", ports->ports, "listen_backlog", "1024",
                                   "connection_queue", "256"});
  CivetCallbacks callbacks;
  callbacks.log_message = LogMessage;
  g_start_error.clear();
  try {
    h->server_ = std::make_unique<CivetServer>(options, &callbacks);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ",
                                               g_start_error.empty() ? ex.what() : g_start_error));
  }
  const std::vector<int> bound = h->server_->getListeningPorts();
  if (bound.empty()) return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  h->port_ = bound[0];
  return h;
}

CivetHost::~CivetHost() {
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
