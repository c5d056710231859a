#include "server/oip/oip_http.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/edge/call_book.h"
#include "server/edge/status.h"
#include "server/oip/oip_infer.h"
#include "server/oip/oip_json.h"

namespace krause::server {
namespace {

void Send(mg_connection* conn, int status, const std::string& body,
          const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  mg_response_header_start(conn, status);
  mg_response_header_add(conn, "Content-Type", "application/json", -1);
  const std::string length = std::to_string(body.size());
  mg_response_header_add(conn, "Content-Length", length.c_str(), -1);
  for (const auto& [k, v] : headers) mg_response_header_add(conn, k.c_str(), v.c_str(), -1);
  mg_response_header_send(conn);
  if (!body.empty()) mg_write(conn, body.data(), body.size());
}

std::string Header(mg_connection* conn, const char* name) {
  const char* v = mg_get_header(conn, name);
  return v == nullptr ? std::string() : std::string(v).substr(0, 256);
}

// One REST call, as CallBook sees it: Finish(status) writes the reply (the success body set
// before, or {"error": ...} with the code's HTTP status, or `override_status` when set).
class RestReply {
 public:
  explicit RestReply(mg_connection* conn) : conn_(conn) {
    for (const char* key : {"X-Request-Id", "traceparent"}) {
      std::string v = Header(conn, key);
      if (!v.empty()) echo_.emplace_back(key, std::move(v));
    }
  }
  void Finish(const grpc::Status& st) {
    if (st.ok()) {
      Send(conn_, 200, ok_body_, echo_);
      return;
    }
    auto headers = echo_;
    if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED)
      headers.emplace_back("WWW-Authenticate", "Bearer");
    const int http = override_status_ != 0 ? override_status_ : HttpStatus(st.error_code());
    Send(conn_, http, oip::ErrorJson(st.error_message()), headers);
  }
  std::string request_id() const {
    for (const auto& [k, v] : echo_)
      if (k[0] == 'X') return v;
    return "";
  }
  std::string traceparent() const {
    for (const auto& [k, v] : echo_)
      if (k[0] == 't') return v;
    return "";
  }
  std::string ok_body_;
  int override_status_ = 0;

 private:
  mg_connection* const conn_;
  std::vector<std::pair<std::string, std::string>> echo_;
};

// The path's parts after /v2/models/: name, version (may be empty), and the action ("" for the
// metadata, "ready", "infer"); nullopt when the path is not of that form.
struct ModelPath {
  std::string name, version, action;
};
std::optional<ModelPath> ParseModelPath(const std::vector<absl::string_view>& parts) {
  // parts: "", "v2", "models", name, [versions, v], [action]
  if (parts.size() < 4 || parts[3].empty()) return std::nullopt;
  ModelPath p;
  p.name = std::string(parts[3]);
  size_t at = 4;
  if (parts.size() > at + 1 && parts[at] == "versions") {
    if (parts[at + 1].empty()) return std::nullopt;
    p.version = std::string(parts[at + 1]);
    at += 2;
  }
  if (parts.size() == at) return p;
  if (parts.size() == at + 1 && (parts[at] == "ready" || parts[at] == "infer")) {
    p.action = std::string(parts[at]);
    return p;
  }
  return std::nullopt;
}

// The text form of a socket address's host and its port (IPv4 or IPv6), as civetweb reports a
// peer; false for other families.
bool HostAndPort(const sockaddr_storage& a, std::string* host, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) == nullptr) return false;
    *port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf)) == nullptr) return false;
    *port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  *host = buf;
  return true;
}

// The socket of a civetweb connection, which civetweb keeps to itself: among the process's
// sockets, the one whose own port is `local_port` and whose peer is `peer`:`peer_port` (a TCP
// connection is unique by its two ends). -1 when none is found. The socket stays open while its
// handler runs (civetweb closes it after the handler returns).
int FindConnectionSocket(int local_port, const std::string& peer, int peer_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, remote{};
    socklen_t ll = sizeof(local), rl = sizeof(remote);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&remote), &rl) != 0)
      continue;
    std::string lhost, rhost;
    int lport = 0, rport = 0;
    if (!HostAndPort(local, &lhost, &lport) || !HostAndPort(remote, &rhost, &rport)) continue;
    if (lport == local_port && rport == peer_port && rhost == peer) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// A REST inference in flight: the core's answer, and an eventfd the answer signals so that the
// waiting civetweb worker can watch it and the client's socket together (no condition
// variable: a client that goes away is seen while the core works).
struct InFlight {
  std::mutex mu;
  std::optional<absl::StatusOr<oip::InferResponse>> result;
  std::atomic<bool> client_gone{false};
  int event_fd = -1;
  ~InFlight() {
    if (event_fd >= 0) close(event_fd);
  }
};

}  // namespace

class OipHttp::Handler : public CivetHandler {
 public:
  Handler(const OipHttpOptions& options, const FrontEndContext* edge, int port)
      : o_(options), edge_(edge), port_(port) {}

  bool handleGet(CivetServer*, mg_connection* conn) override { return Serve(conn, false); }
  bool handlePost(CivetServer*, mg_connection* conn) override { return Serve(conn, true); }
  bool handleHead(CivetServer*, mg_connection* conn) override { return NotAllowed(conn, "GET"); }
  bool handlePut(CivetServer*, mg_connection* conn) override { return NotAllowed(conn, "GET"); }
  bool handleDelete(CivetServer*, mg_connection* conn) override { return NotAllowed(conn, "GET"); }

 private:
  bool NotAllowed(mg_connection* conn, const char* allow) {
    Send(conn, 405, oip::ErrorJson(absl::StrCat("method not allowed here; use ", allow)),
         {{"Allow", allow}});
    return true;
  }

  bool Serve(mg_connection* conn, bool post) {
    const mg_request_info* ri = mg_get_request_info(conn);
    const std::string path = ri->local_uri != nullptr ? ri->local_uri : "";
    std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
    if (parts.size() > 1 && parts.back().empty()) parts.pop_back();  // a trailing slash
    if (parts.size() < 2 || parts[0] != "" || parts[1] != "v2") return NotFound(conn, path);
    const Gate& gate = *edge_->gate;
    if (parts.size() == 4 && parts[2] == "health") {
      if (post) return NotAllowed(conn, "GET");
      if (parts[3] == "live") {
        Send(conn, 200, R"({"live":true})");
        return true;
      }
      if (parts[3] == "ready") {
        const bool ready = gate.registry() != nullptr && !gate.draining();
        Send(conn, ready ? 200 : 503, ready ? R"({"ready":true})" : R"({"ready":false})");
        return true;
      }
      return NotFound(conn, path);
    }
    if (parts.size() == 2) {
      if (post) return NotAllowed(conn, "GET");
      return Call(conn, "ServerMetadata", [](RestReply* reply, CallBook*) {
        reply->ok_body_ = oip::ServerMetadataJson();
        return absl::OkStatus();
      });
    }
    if (parts[2] != "models") return NotFound(conn, path);
    const std::optional<ModelPath> mp = ParseModelPath(parts);
    if (!mp) return NotFound(conn, path);
    if ((mp->action == "infer") != post) return NotAllowed(conn, post ? "GET" : "POST");
    if (mp->action == "ready") {
      if (gate.registry() == nullptr) {
        Send(conn, 503, R"({"ready":false})");
        return true;
      }
      auto m = oip::FindModel(*gate.registry(), mp->name, mp->version);
      if (m.status().code() == absl::StatusCode::kUnavailable) {  // unloaded by model control
        Send(conn, 503, R"({"ready":false})");
        return true;
      }
      if (!m.ok()) {
        Send(conn, HttpStatus(ToGrpcStatus(m.status()).error_code()),
             oip::ErrorJson(m.status().message()));
        return true;
      }
      const bool ready = !gate.draining();
      Send(conn, ready ? 200 : 503, ready ? R"({"ready":true})" : R"({"ready":false})");
      return true;
    }
    if (mp->action.empty()) {
      return Call(conn, "ModelMetadata", [&](RestReply* reply, CallBook* book) -> absl::Status {
        auto m = oip::FindModel(*gate.registry(), mp->name, mp->version);
        if (!m.ok()) return m.status();
        book->set_model(*m);
        reply->ok_body_ =
            oip::ModelMetadataJson(oip::MetadataOf(**m, gate.registry()->Versions(mp->name)));
        return absl::OkStatus();
      });
    }
    return Call(conn, "ModelInfer",
                [&](RestReply* reply, CallBook* book) { return Infer(conn, *mp, reply, book); });
  }

  bool NotFound(mg_connection* conn, const std::string& path) {
    Send(conn, 404,
         oip::ErrorJson(
             absl::StrCat("no such path: ", path.substr(0, 128), " (the API is under /v2)")));
    return true;
  }

  // A counted call: through the gate, `body` (which fills the reply's body), the request log and
  // the metrics, then the reply.
  template <typename Body>
  bool Call(mg_connection* conn, const char* rpc, Body&& body) {
    const mg_request_info* ri = mg_get_request_info(conn);
    RestReply reply(conn);
    CallBook book(edge_->gate, edge_->observer, edge_->request_log, rpc, kProtocolOipRest);
    std::optional<std::string_view> authorization;
    const char* auth = mg_get_header(conn, "Authorization");
    if (auth != nullptr) authorization = std::string_view(auth);
    absl::Status st = book.Enter(authorization, reply.request_id(), reply.traceparent(),
                                 absl::StrCat("ipv4:", ri->remote_addr, ":", ri->remote_port));
    if (st.ok()) st = Guarded(rpc, [&] { return body(&reply, &book); });
    book.Finish(&reply, st);
    return true;
  }

  // Reads the body (413 over the limit, 408 when it does not arrive in time), starts the
  // inference and waits for it (this worker only: the model threads never wait on HTTP).
  absl::Status Infer(mg_connection* conn, const ModelPath& mp, RestReply* reply, CallBook* book) {
    const mg_request_info* ri = mg_get_request_info(conn);
    if (ri->content_length > o_.max_body_bytes) {
      reply->override_status_ = 413;
      return absl::InvalidArgumentError(absl::StrCat("the body has ", ri->content_length,
                                                     " bytes; the limit is ", o_.max_body_bytes));
    }
    std::string body;
    if (ri->content_length > 0) body.reserve(static_cast<size_t>(ri->content_length));
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.request_timeout_ms);
    char buf[1 << 16];
    for (;;) {
      const int n = mg_read(conn, buf, sizeof(buf));
      if (n < 0) {
        reply->override_status_ = 408;
        return absl::DeadlineExceededError("the body did not arrive in time");
      }
      if (n == 0) break;
      body.append(buf, static_cast<size_t>(n));
      if (static_cast<int64_t>(body.size()) > o_.max_body_bytes) {
        reply->override_status_ = 413;
        return absl::InvalidArgumentError(
            absl::StrCat("the body is over the limit of ", o_.max_body_bytes, " bytes"));
      }
      if (std::chrono::steady_clock::now() > until) {
        reply->override_status_ = 408;
        return absl::DeadlineExceededError(
            absl::StrCat("the body did not arrive within ", o_.request_timeout_ms, " ms"));
      }
    }
    if (ri->content_length >= 0 && static_cast<int64_t>(body.size()) != ri->content_length) {
      reply->override_status_ = 408;
      return absl::DeadlineExceededError(
          absl::StrCat("the body ended after ", body.size(), " of ", ri->content_length, " bytes"));
    }
    auto request = oip::ParseInferJson(body, mp.name, mp.version);
    if (!request.ok()) return request.status();
    auto f = std::make_shared<InFlight>();
    f->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (f->event_fd < 0) return absl::ResourceExhaustedError("no eventfd for the call");
    oip::InferContext c;
    c.book = book;
    c.observer = edge_->observer;
    c.replies = edge_->replies;
    c.fault = edge_->fault;
    // The call's deadline: its `timeout` parameter (StartInfer), within the server's default.
    if (o_.deadline_ms > 0) c.deadline = book->start() + std::chrono::milliseconds(o_.deadline_ms);
    c.cancelled = [f] { return f->client_gone.load(); };
    absl::Status st = oip::StartInfer(*edge_->gate->registry(), std::move(*request), c,
                                      [f](absl::StatusOr<oip::InferResponse> r) {
                                        std::lock_guard<std::mutex> lock(f->mu);
                                        f->result = std::move(r);
                                        const uint64_t one = 1;
                                        (void)!write(f->event_fd, &one, sizeof(one));
                                      });
    if (!st.ok()) return st;
    WaitFor(conn, f.get());
    std::lock_guard<std::mutex> lock(f->mu);
    if (f->client_gone.load()) reply->override_status_ = 499;  // nobody reads it
    if (!f->result->ok()) return f->result->status();
    reply->ok_body_ = oip::InferResponseJson(**f->result);
    return absl::OkStatus();
  }

  // Until the core answers `f` (it always does, exactly once). Past kWatchAfterMs the client's
  // socket is watched as well: when the client goes away (the peer closed or reset the
  // connection), the call is cancelled and the core stops its work (a generation frees its cache
  // slots at the next decode step); the answer still comes and is dropped. The core ends the work
  // at the call's deadline itself.
  void WaitFor(mg_connection* conn, InFlight* f) {
    constexpr int kWatchAfterMs = 20;
    pollfd fds[2] = {{f->event_fd, POLLIN, 0}, {-1, POLLRDHUP, 0}};
    if (poll(fds, 1, kWatchAfterMs) > 0) return;
    const mg_request_info* ri = mg_get_request_info(conn);
    fds[1].fd = FindConnectionSocket(port_, ri->remote_addr, ri->remote_port);
    for (;;) {
      const int n = poll(fds, fds[1].fd >= 0 ? 2 : 1, -1);
      if (n < 0) {
        if (errno != EINTR) fds[1].fd = -1;  // watch the answer alone
        continue;
      }
      if (fds[0].revents & POLLIN) return;
      if (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        f->client_gone = true;
        fds[1].fd = -1;  // told once; now only the answer
      }
    }
  }

  const OipHttpOptions o_;
  const FrontEndContext* const edge_;
  const int port_;  // the listening port (to find a connection's socket)
};

absl::StatusOr<std::unique_ptr<OipHttp>> OipHttp::Start(const OipHttpOptions& options,
                                                        const FrontEndContext* edge) {
  if (options.threads < 1 || options.request_timeout_ms < 1 || options.keep_alive_timeout_ms < 1)
    return absl::InvalidArgumentError("--http_threads and the HTTP timeouts must be at least 1");
  std::unique_ptr<OipHttp> h(new OipHttp());
  auto host = CivetHost::Start(
      options.address, {"num_threads", std::to_string(options.threads), "request_timeout_ms",
                        std::to_string(options.request_timeout_ms), "keep_alive_timeout_ms",
                        std::to_string(options.keep_alive_timeout_ms), "enable_keep_alive", "yes"});
  if (!host.ok()) return host.status();
  h->host_ = std::move(*host);
  h->handler_ = std::make_unique<Handler>(options, edge, h->host_->port());
  h->host_->server()->addHandler("/", h->handler_.get());
  return h;
}

OipHttp::~OipHttp() { host_.reset(); }  // joins the workers before the handler goes

}  // namespace krause::server
