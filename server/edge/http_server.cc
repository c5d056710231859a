// The event-driven HTTP server (http_server.h). One file past the 500 lines the others keep, on
// purpose: it is one session class (StreamSession, over TCP or TLS, with its Exchange), whose
// reading, limits, watching and writing share the session's state and strand, and Boost.Beast's
// templates are slow enough to compile that krause_http builds this one translation unit alone.
#include "server/edge/http_server.h"

#include <pthread.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace krause::server {
namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using boost::system::error_code;

class Session;

// What the server, its sessions and the exchanges that may outlive it share.
struct Shared {
  HttpServerOptions options;
  std::unique_ptr<net::ssl::context> tls;  // set: every connection is HTTPS
  HttpHandler handler;
  std::mutex mu;
  bool stopped = false;                                   // guarded by mu
  std::unordered_set<std::shared_ptr<Session>> sessions;  // guarded by mu: every open one
  std::atomic<int64_t> open{0};
};

// Why a read was cancelled by the session's timer.
enum class Deadline { kNone, kFirstBytes, kHeader, kBody, kWrite, kLinger };

class Exchange;

// A connection, whatever carries it (plain TCP or TLS): what the exchanges and the server
// reach it by.
class Session : public std::enable_shared_from_this<Session> {
 public:
  virtual ~Session() = default;
  virtual void Start() = 0;
  // Called from Exchange on the strand.
  virtual void WriteReply(HttpResponse response) = 0;
  virtual void WriteStreamHead(int status, HttpHeaders headers, StreamKeepAlive keep_alive) = 0;
  virtual void QueuePiece(std::string piece) = 0;
  virtual void QueueEnd() = 0;
  virtual net::any_io_executor executor() = 0;

  // Runs `fn(session)` on the session's strand unless the server has stopped. The session is
  // taken from `weak` under the server's lock, and handed to the io_context with the work: no
  // reference to it is left outside the io_context once the server has stopped (a socket must
  // not outlive its io_context).
  template <typename Fn>
  static void Post(Shared& shared, const std::weak_ptr<Session>& weak, Fn fn) {
    std::lock_guard<std::mutex> lock(shared.mu);
    if (shared.stopped) return;
    std::shared_ptr<Session> s = weak.lock();
    if (!s) return;
    auto executor = s->executor();
    net::post(executor, [s = std::move(s), fn = std::move(fn)]() mutable { fn(*s); });
  }
};

// A session over `Stream`: tcp::socket (HTTP) or ssl::stream<tcp::socket> (HTTPS, which shakes
// hands before the first request).
template <class Stream>
class StreamSession final : public Session {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  StreamSession(Stream stream, std::shared_ptr<Shared> shared)
      : stream_(std::move(stream)),
        timer_(stream_.get_executor()),
        ping_timer_(stream_.get_executor()),
        shared_(std::move(shared)) {}

  void Start() override {
    error_code ec;
    const tcp::endpoint peer = Socket().remote_endpoint(ec);
    if (!ec) {
      peer_ = peer.address().is_v6()
                  ? absl::StrCat("ipv6:[", peer.address().to_string(), "]:", peer.port())
                  : absl::StrCat("ipv4:", peer.address().to_string(), ":", peer.port());
    }
    Socket().set_option(tcp::no_delay(true), ec);
    net::post(stream_.get_executor(), [self = Self()] { self->Handshake(); });
  }
  net::any_io_executor executor() override { return stream_.get_executor(); }

  void WriteReply(HttpResponse response) override;
  void WriteStreamHead(int status, HttpHeaders headers, StreamKeepAlive keep_alive) override;
  void QueuePiece(std::string piece) override;
  void QueueEnd() override;
  void Close();

 private:
  std::shared_ptr<StreamSession> Self() {
    return std::static_pointer_cast<StreamSession>(shared_from_this());
  }
  tcp::socket& Socket() { return beast::get_lowest_layer(stream_); }
  // TLS: the handshake, within the header timeout (a client that sends plain HTTP fails it and
  // gets no answer); then, as for plain HTTP, the first request.
  void Handshake();
  // A connection with no request yet (first) or kept alive between requests: wait for its first
  // bytes (closed quietly if none come), then read the headers.
  void WaitForBytes(bool first);
  void ReadHeader();
  bool ReadFailed(error_code ec, Deadline phase);
  void OnHeader(error_code ec);
  void ReadBody();
  void OnBody(error_code ec);
  void Dispatch();
  void Watch();
  void OnWatch(error_code ec, uint64_t generation);
  void Refuse(int status, const std::string& why);
  void AfterAnswer();
  void Linger();
  void DrainUntilClosed();
  void PumpStream();
  void ArmPing();
  void Gone();
  void Arm(int ms, Deadline what);
  void Disarm() {
    ++arm_generation_;
    timer_.cancel();
  }

  Stream stream_;
  net::steady_timer timer_;
  net::steady_timer ping_timer_;  // a stream's keep-alive
  std::shared_ptr<Shared> shared_;
  std::string peer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t arm_generation_ = 0;
  Deadline expired_ = Deadline::kNone;
  bool closed_ = false;
  bool keep_alive_ = true;
  bool head_request_ = false;
  unsigned version_ = 11;
  std::shared_ptr<Exchange> current_;  // the request waiting for (or in) its answer
  uint64_t watch_generation_ = 0;      // a watch of an older request is ignored
  bool watching_ = false;
  // The answer being written.
  std::shared_ptr<http::response<http::string_body>> reply_;
  std::optional<http::response<http::empty_body>> stream_head_;
  std::optional<http::response_serializer<http::empty_body>> stream_serializer_;
  bool chunked_ = false;
  bool head_written_ = false;
  bool writing_ = false;
  bool ending_ = false;
  std::deque<std::string> pieces_;
  StreamKeepAlive keep_alive_piece_;
  uint64_t ping_generation_ = 0;  // a ping armed for an older stream is ignored
  std::chrono::steady_clock::time_point last_write_{};
  std::array<char, 16384> scratch_;  // what a lingering connection still sends, dropped
  decltype(http::make_chunk_last()) last_chunk_ = http::make_chunk_last();
};

class Exchange : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Shared> shared, std::weak_ptr<Session> session)
      : shared_(std::move(shared)), session_(std::move(session)) {}

  void Reply(HttpResponse response) override {
    if (!Claim()) return;
    Session::Post(*shared_, session_,
                  [r = std::move(response)](Session& s) mutable { s.WriteReply(std::move(r)); });
  }
  void StartStream(int status, HttpHeaders headers, StreamKeepAlive keep_alive) override {
    if (!Claim()) return;
    Session::Post(*shared_, session_,
                  [status, h = std::move(headers), k = std::move(keep_alive)](Session& s) mutable {
                    s.WriteStreamHead(status, std::move(h), std::move(k));
                  });
  }
  void Send(std::string piece) override {
    if (piece.empty() || Gone()) return;
    backlog += static_cast<int64_t>(piece.size());
    Session::Post(*shared_, session_,
                  [p = std::move(piece)](Session& s) mutable { s.QueuePiece(std::move(p)); });
  }
  void End() override {
    Session::Post(*shared_, session_, [](Session& s) { s.QueueEnd(); });
  }
  int64_t Backlog() const override { return backlog.load(); }
  bool Gone() const override { return gone_.load(); }
  void OnGone(std::function<void()> action) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!gone_.load()) {
        on_gone_ = std::move(action);
        return;
      }
    }
    // Gone already: run it on a loop thread, as promised (if the server still runs).
    Session::Post(*shared_, session_, [a = std::move(action)](Session&) { a(); });
  }

  // On the session's strand: the client left before the answer ended.
  void MarkGone() {
    std::function<void()> action;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_.exchange(true)) return;
      action = std::move(on_gone_);
    }
    backlog = 0;
    if (action) action();
  }
  // On the session's strand: the answer has ended; a later close is not a client leaving.
  void MarkEnded() {
    std::lock_guard<std::mutex> lock(mu_);
    on_gone_ = nullptr;
  }

  std::atomic<int64_t> backlog{0};  // bytes handed to Send and not yet written

 private:
  bool Claim() { return !claimed_.exchange(true); }

  std::shared_ptr<Shared> shared_;
  std::weak_ptr<Session> session_;
  std::atomic<bool> claimed_{false};
  std::atomic<bool> gone_{false};
  std::mutex mu_;
  std::function<void()> on_gone_;  // guarded by mu_
};

std::string BodyOverLimit(int64_t limit) {
  return absl::StrCat("the request's body is over the limit of ", limit, " bytes");
}

std::string ErrorBody(const std::string& why) {
  std::string escaped;
  for (char c : why) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return absl::StrCat("{\"error\":\"", escaped, "\"}");
}

template <class Stream>
void StreamSession<Stream>::Arm(int ms, Deadline what) {
  expired_ = Deadline::kNone;
  const uint64_t generation = ++arm_generation_;
  timer_.expires_after(std::chrono::milliseconds(ms));
  // An expiry already queued when the timer was re-armed carries an old generation: ignored.
  timer_.async_wait([self = Self(), what, generation](error_code ec) {
    if (ec || generation != self->arm_generation_ || self->closed_) return;
    self->expired_ = what;
    if (what == Deadline::kWrite) {
      self->Close();  // a client that does not read: dropped
    } else {
      error_code ignored;
      self->Socket().cancel(ignored);  // the read completes with operation_aborted
    }
  });
}

template <class Stream>
void StreamSession<Stream>::Handshake() {
  if constexpr (!kTls) {
    WaitForBytes(true);
  } else {
    Arm(shared_->options.header_timeout_ms, Deadline::kFirstBytes);
    stream_.async_handshake(net::ssl::stream_base::server, [self = Self()](error_code ec) {
      self->Disarm();
      if (ec) {
        self->Close();  // not TLS (plain HTTP gets no answer), no client certificate, too slow
        return;
      }
      self->WaitForBytes(true);
    });
  }
}

template <class Stream>
void StreamSession<Stream>::WaitForBytes(bool first) {
  if (closed_) return;
  if (buffer_.size() > 0) {  // a pipelined request is here already
    ReadHeader();
    return;
  }
  const HttpServerOptions& o = shared_->options;
  Arm(first ? o.header_timeout_ms : o.idle_timeout_ms, Deadline::kFirstBytes);
  stream_.async_read_some(buffer_.prepare(4096), [self = Self()](error_code ec, size_t n) {
    self->Disarm();
    if (ec) {
      self->Close();  // idle timeout or the client closed: nothing to answer
      return;
    }
    self->buffer_.commit(n);
    self->ReadHeader();
  });
}

template <class Stream>
void StreamSession<Stream>::ReadHeader() {
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(shared_->options.max_header_bytes));
  // The body's limit is checked once the headers are read (OnHeader), so that a refusal can
  // say what the request was for. (Not boost::none: Boost 1.74's parser compares a length with
  // the optional limit, and every length is "over" an empty one.)
  parser_->body_limit(std::numeric_limits<uint64_t>::max());
  Arm(shared_->options.header_timeout_ms, Deadline::kHeader);
  http::async_read_header(stream_, buffer_, *parser_, [self = Self()](error_code ec, size_t) {
    self->Disarm();
    self->OnHeader(ec);
  });
}

// A read of the request that failed, or whose deadline passed: the answer the client gets, if
// any (408, 413, 431 or 400; a client that closed gets none). False when there was no error.
template <class Stream>
bool StreamSession<Stream>::ReadFailed(error_code ec, Deadline phase) {
  if (!ec) return false;
  const HttpServerOptions& o = shared_->options;
  if (ec == net::error::operation_aborted && expired_ == phase) {
    const bool header = phase == Deadline::kHeader;
    Refuse(408,
           absl::StrCat("the request's ", header ? "headers" : "body", " did not arrive within ",
                        header ? o.header_timeout_ms : o.body_timeout_ms, " ms"));
  } else if (ec == http::error::header_limit) {
    Refuse(431, absl::StrCat("the request's headers are over the limit of ", o.max_header_bytes,
                             " bytes"));
  } else if (ec == http::error::body_limit) {
    Refuse(413, BodyOverLimit(o.max_body_bytes));
  } else if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
             ec == net::error::eof || ec == net::error::connection_reset ||
             ec == net::error::operation_aborted) {
    Close();
  } else {
    Refuse(400, absl::StrCat("bad request: ", ec.message()));
  }
  return true;
}

template <class Stream>
void StreamSession<Stream>::OnHeader(error_code ec) {
  if (closed_ || ReadFailed(ec, Deadline::kHeader)) return;
  const uint64_t max_body = static_cast<uint64_t>(shared_->options.max_body_bytes);
  if (parser_->content_length() && *parser_->content_length() > max_body) {
    Refuse(413, BodyOverLimit(shared_->options.max_body_bytes));
    return;
  }
  parser_->body_limit(max_body);  // a chunked body: checked as it arrives
  if (parser_->is_done()) {
    Dispatch();
    return;
  }
  const auto& head = parser_->get();
  if (absl::EqualsIgnoreCase(std::string(head[http::field::expect]), "100-continue")) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    Arm(shared_->options.write_timeout_ms, Deadline::kWrite);
    net::async_write(stream_, net::buffer(kContinue), [self = Self()](error_code ec, size_t) {
      self->Disarm();
      if (ec) {
        self->Close();
        return;
      }
      self->ReadBody();
    });
    return;
  }
  ReadBody();
}

template <class Stream>
void StreamSession<Stream>::ReadBody() {
  Arm(shared_->options.body_timeout_ms, Deadline::kBody);
  http::async_read(stream_, buffer_, *parser_, [self = Self()](error_code ec, size_t) {
    self->Disarm();
    self->OnBody(ec);
  });
}

template <class Stream>
void StreamSession<Stream>::OnBody(error_code ec) {
  if (closed_ || ReadFailed(ec, Deadline::kBody)) return;
  Dispatch();
}

template <class Stream>
void StreamSession<Stream>::Dispatch() {
  http::request<http::string_body> msg = parser_->release();
  parser_.reset();
  keep_alive_ = msg.keep_alive();
  version_ = msg.version();
  head_request_ = msg.method() == http::verb::head;
  HttpRequest request;
  request.method = std::string(msg.method_string());
  request.target = std::string(msg.target());
  request.version = static_cast<int>(version_);
  for (const auto& field : msg) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  request.body = std::move(msg.body());
  request.peer = peer_;
  current_ = std::make_shared<Exchange>(shared_, weak_from_this());
  head_written_ = writing_ = ending_ = chunked_ = false;
  Watch();
  std::shared_ptr<Exchange> exchange = current_;
  try {
    shared_->handler(std::move(request), exchange);
  } catch (...) {  // a handler's bug costs its request a 500, never the loop thread
    exchange->Reply({500,
                     {{"Content-Type", "application/json"}},
                     ErrorBody("internal error in the HTTP handler")});
  }
}

// While the request waits for (or streams) its answer, the socket is watched for the client's
// end: readable with nothing to read is the peer's FIN (or an error its reset). Bytes from the
// client (a pipelined request) end the watch; they are read after the answer.
template <class Stream>
void StreamSession<Stream>::Watch() {
  watching_ = true;
  const uint64_t generation = ++watch_generation_;
  Socket().async_wait(tcp::socket::wait_read, [self = Self(), generation](error_code ec) {
    self->OnWatch(ec, generation);
  });
}

template <class Stream>
void StreamSession<Stream>::OnWatch(error_code ec, uint64_t generation) {
  if (closed_ || generation != watch_generation_ || !watching_) return;
  if (ec) return;  // cancelled: the session is closing or moving on
  char byte;
  const ssize_t n = ::recv(Socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    Gone();
    return;
  }
  if (n < 0) {  // spurious wake-up
    Watch();
    return;
  }
  watching_ = false;  // a pipelined request: read after this answer
}

template <class Stream>
void StreamSession<Stream>::Gone() {
  if (current_) current_->MarkGone();
  Close();
}

template <class Stream>
void StreamSession<Stream>::Refuse(int status, const std::string& why) {
  if (shared_->options.on_refused) {
    HttpRefusal r{status, why, peer_, "", ""};
    if (parser_ && parser_->is_header_done()) {
      r.method = std::string(parser_->get().method_string());
      r.target = std::string(parser_->get().target());
    }
    try {
      shared_->options.on_refused(r);
    } catch (...) {  // counting a refusal must not take the loop thread down
    }
  }
  keep_alive_ = false;
  head_request_ = false;
  version_ = 11;
  current_.reset();
  WriteReply({status, {{"Content-Type", "application/json"}}, ErrorBody(why)});
}

template <class Stream>
void StreamSession<Stream>::WriteReply(HttpResponse response) {
  if (closed_) return;
  reply_ = std::make_shared<http::response<http::string_body>>();
  reply_->version(version_);
  reply_->result(static_cast<unsigned>(response.status));
  for (auto& [name, value] : response.headers) reply_->set(name, value);
  reply_->keep_alive(keep_alive_);
  if (head_request_) {  // HEAD: the length the body would have, no body
    reply_->content_length(response.body.size());
  } else {
    reply_->body() = std::move(response.body);
    reply_->prepare_payload();
  }
  Arm(shared_->options.write_timeout_ms, Deadline::kWrite);
  http::async_write(stream_, *reply_, [self = Self()](error_code ec, size_t) {
    self->Disarm();
    self->reply_.reset();
    if (ec) {
      self->Gone();
      return;
    }
    self->AfterAnswer();
  });
}

template <class Stream>
void StreamSession<Stream>::AfterAnswer() {
  ++ping_generation_;
  ping_timer_.cancel();
  if (current_) current_->MarkEnded();
  current_.reset();
  watching_ = false;
  ++watch_generation_;
  if (!keep_alive_) {
    error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_send, ignored);
    Linger();
    return;
  }
  WaitForBytes(false);
}

// After the last answer on a connection (a refusal such as 413 while the client may still be
// sending its body, or a Connection: close): the answer is sent and our side shut; what the
// client still sends is read and dropped until it closes, for at most kLingerMs. Closing at once
// would make the kernel reset the connection when more bytes arrive, and a client still sending
// would see "connection reset" instead of the answer.
template <class Stream>
void StreamSession<Stream>::Linger() {
  constexpr int kLingerMs = 2000;
  if (closed_) return;
  Arm(kLingerMs, Deadline::kLinger);
  DrainUntilClosed();
}

template <class Stream>
void StreamSession<Stream>::DrainUntilClosed() {
  Socket().async_read_some(net::buffer(scratch_), [self = Self()](error_code ec, size_t) {
    if (ec || self->closed_) {
      self->Disarm();
      self->Close();
      return;
    }
    self->DrainUntilClosed();
  });
}

template <class Stream>
void StreamSession<Stream>::WriteStreamHead(int status, HttpHeaders headers,
                                            StreamKeepAlive keep_alive) {
  if (closed_) return;
  keep_alive_piece_ = std::move(keep_alive);
  stream_head_.emplace();
  stream_head_->version(version_);
  stream_head_->result(static_cast<unsigned>(status));
  for (auto& [name, value] : headers) stream_head_->set(name, value);
  if (version_ >= 11) {
    chunked_ = true;
    stream_head_->chunked(true);
    stream_head_->keep_alive(keep_alive_);
  } else {
    chunked_ = false;
    keep_alive_ = false;  // an HTTP/1.0 stream ends with the connection
    stream_head_->keep_alive(false);
  }
  stream_serializer_.emplace(*stream_head_);
  writing_ = true;
  Arm(shared_->options.write_timeout_ms, Deadline::kWrite);
  http::async_write_header(stream_, *stream_serializer_, [self = Self()](error_code ec, size_t) {
    self->Disarm();
    self->writing_ = false;
    if (ec) {
      self->Gone();
      return;
    }
    self->head_written_ = true;
    self->last_write_ = std::chrono::steady_clock::now();
    self->ArmPing();
    self->PumpStream();
  });
}

template <class Stream>
void StreamSession<Stream>::QueuePiece(std::string piece) {
  if (closed_) return;
  pieces_.push_back(std::move(piece));
  PumpStream();
}

template <class Stream>
void StreamSession<Stream>::QueueEnd() {
  if (closed_) return;
  ending_ = true;
  PumpStream();
}

template <class Stream>
void StreamSession<Stream>::PumpStream() {
  if (closed_ || writing_ || !head_written_) return;
  if (!pieces_.empty()) {
    writing_ = true;
    Arm(shared_->options.write_timeout_ms, Deadline::kWrite);
    auto done = [self = Self()](error_code ec, size_t) {
      self->Disarm();
      self->writing_ = false;
      if (self->closed_) return;  // pieces_ stays as it was: the session is over
      if (ec) {
        self->Gone();
        return;
      }
      if (self->current_) {
        self->current_->backlog -= static_cast<int64_t>(self->pieces_.front().size());
      }
      self->pieces_.pop_front();
      self->last_write_ = std::chrono::steady_clock::now();
      self->PumpStream();
    };
    if (chunked_) {
      net::async_write(stream_, http::make_chunk(net::buffer(pieces_.front())), std::move(done));
    } else {
      net::async_write(stream_, net::buffer(pieces_.front()), std::move(done));
    }
    return;
  }
  if (!ending_) return;
  ending_ = false;
  if (!chunked_) {
    AfterAnswer();  // keep_alive_ is false: the connection's end ends the body
    return;
  }
  writing_ = true;
  Arm(shared_->options.write_timeout_ms, Deadline::kWrite);
  net::async_write(stream_, last_chunk_, [self = Self()](error_code ec, size_t) {
    self->Disarm();
    self->writing_ = false;
    if (ec) {
      self->Gone();
      return;
    }
    self->stream_serializer_.reset();
    self->stream_head_.reset();
    self->AfterAnswer();
  });
}

// While a stream with a keep-alive is open: its piece goes out whenever nothing has been
// written for the interval (nothing queued, nothing being written).
template <class Stream>
void StreamSession<Stream>::ArmPing() {
  const int ms = keep_alive_piece_.interval_ms;
  if (ms <= 0 || keep_alive_piece_.piece.empty() || closed_) return;
  const uint64_t generation = ++ping_generation_;
  const auto now = std::chrono::steady_clock::now();
  auto due = last_write_ + std::chrono::milliseconds(ms);
  if (due <= now) due = now + std::chrono::milliseconds(ms);  // a write still going: later
  ping_timer_.expires_at(due);
  ping_timer_.async_wait([self = Self(), generation](error_code ec) {
    if (ec || self->closed_ || generation != self->ping_generation_) return;
    const auto idle = std::chrono::steady_clock::now() - self->last_write_;
    if (idle >= std::chrono::milliseconds(self->keep_alive_piece_.interval_ms) && !self->writing_ &&
        self->pieces_.empty() && !self->ending_) {
      if (self->current_) {
        self->current_->backlog += static_cast<int64_t>(self->keep_alive_piece_.piece.size());
      }
      self->QueuePiece(self->keep_alive_piece_.piece);
    }
    self->ArmPing();
  });
}

template <class Stream>
void StreamSession<Stream>::Close() {
  if (closed_) return;
  closed_ = true;
  if (current_) current_->MarkGone();  // an answer that never ended: the client is gone to it
  current_.reset();
  error_code ignored;
  timer_.cancel();
  ping_timer_.cancel();
  Socket().close(ignored);  // pending operations complete with operation_aborted
  shared_->open.fetch_sub(1);
  std::shared_ptr<Session> self = shared_from_this();
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->sessions.erase(self);
}

// The server's TLS: its certificate chain and key, TLS 1.2 or later, and with a client CA a
// certificate it signed required of every client.
absl::StatusOr<std::unique_ptr<net::ssl::context>> TlsContext(const HttpTls& tls) {
  auto ctx = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
  error_code ec;
  ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                       net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                       net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use,
                   ec);
  if (!ec) ctx->use_certificate_chain(net::buffer(tls.cert_pem), ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("TLS certificate: ", ec.message()));
  ctx->use_private_key(net::buffer(tls.key_pem), net::ssl::context::pem, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("TLS key: ", ec.message()));
  if (!tls.client_ca_pem.empty()) {
    ctx->add_certificate_authority(net::buffer(tls.client_ca_pem), ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("TLS client CA: ", ec.message()));
    ctx->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("TLS client CA: ", ec.message()));
  }
  return ctx;
}

// "host:port" to an endpoint.
absl::StatusOr<tcp::endpoint> Resolve(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("address must be host:port, got ", address));
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535)
    return absl::InvalidArgumentError(absl::StrCat("address must be host:port, got ", address));
  if (!host.empty() && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const auto port_number = static_cast<unsigned short>(std::stoi(port));
  if (host.empty() || host == "0.0.0.0") return tcp::endpoint(tcp::v4(), port_number);
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  error_code ec;
  auto results = resolver.resolve(host, port, ec);
  if (ec || results.empty())
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", address));
  return results.begin()->endpoint();
}

}  // namespace

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (absl::EqualsIgnoreCase(n, absl::string_view(name.data(), name.size()))) return v;
  }
  return {};
}

struct HttpServer::Impl {
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::vector<std::thread> threads;
  net::steady_timer retry{ioc};
  int port = 0;

  void Accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors or a transient error: try again shortly, never spin.
        retry.expires_after(std::chrono::milliseconds(50));
        retry.async_wait([this](error_code e) {
          if (!e) Accept();
        });
        return;
      }
      std::shared_ptr<Session> session;
      if (shared->tls) {
        session = std::make_shared<StreamSession<net::ssl::stream<tcp::socket>>>(
            net::ssl::stream<tcp::socket>(std::move(socket), *shared->tls), shared);
      } else {
        session = std::make_shared<StreamSession<tcp::socket>>(std::move(socket), shared);
      }
      {
        std::lock_guard<std::mutex> lock(shared->mu);
        if (shared->stopped) return;
        shared->sessions.insert(session);
      }
      shared->open.fetch_add(1);
      session->Start();
      Accept();
    });
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  if (options.threads < 1 || options.threads > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP threads must be in [1, 64], got ", options.threads));
  auto endpoint = Resolve(options.address);
  if (!endpoint.ok()) return endpoint.status();
  auto impl = std::make_unique<Impl>();
  impl->shared->options = options;
  impl->shared->handler = std::move(handler);
  if (options.tls) {
    auto tls = TlsContext(*options.tls);
    if (!tls.ok()) return tls.status();
    impl->shared->tls = std::move(*tls);
  }
  error_code ec;
  impl->acceptor.open(endpoint->protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(*endpoint, ec);
  if (!ec) impl->acceptor.listen(1024, ec);
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.address, ": ", ec.message()));
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  for (int i = 0; i < options.threads; ++i) {
    impl->threads.emplace_back([ioc = &impl->ioc, name = options.thread_name.substr(0, 15)] {
      pthread_setname_np(pthread_self(), name.c_str());
      ioc->run();
    });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() {
  {
    std::lock_guard<std::mutex> lock(impl_->shared->mu);
    impl_->shared->stopped = true;  // exchanges post nothing from now on
  }
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  error_code ignored;
  impl_->acceptor.close(ignored);
  std::unordered_set<std::shared_ptr<Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(impl_->shared->mu);
    sessions.swap(impl_->shared->sessions);
  }
  sessions.clear();  // their sockets close while the io_context still exists
}

int HttpServer::port() const { return impl_->port; }

int64_t HttpServer::open_connections() const { return impl_->shared->open.load(); }

}  // namespace krause::server
