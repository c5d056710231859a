#include "client/http_load.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

namespace krause::client {
namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One kept-alive connection; a call holds it while it runs.
struct Conn {
  explicit Conn(net::io_context& ioc) : stream(net::make_strand(ioc)) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  bool open = false;
};

}  // namespace

std::string CodeOfHttpStatus(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "INVALID_ARGUMENT";
    case 401:
      return "UNAUTHENTICATED";
    case 403:
      return "PERMISSION_DENIED";
    case 404:
      return "NOT_FOUND";
    case 408:
    case 504:
      return "DEADLINE_EXCEEDED";
    case 409:
      return "ABORTED";
    case 413:
    case 429:
      return "RESOURCE_EXHAUSTED";
    case 499:
      return "CANCELLED";
    case 501:
      return "UNIMPLEMENTED";
    case 503:
      return "UNAVAILABLE";
    case 500:
      return "INTERNAL";
    default:
      return "HTTP_" + std::to_string(status);
  }
}

struct HttpLoadClient::Impl {
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> work{ioc.get_executor()};
  std::vector<std::thread> threads;
  std::optional<tcp::endpoint> endpoint;  // unset: the address did not resolve
  std::string host, token, resolve_error;
  std::mutex mu;
  std::vector<std::shared_ptr<Conn>> idle;  // guarded by mu

  std::shared_ptr<Conn> Take() {
    std::lock_guard<std::mutex> lock(mu);
    if (idle.empty()) return std::make_shared<Conn>(ioc);
    std::shared_ptr<Conn> c = std::move(idle.back());
    idle.pop_back();
    return c;
  }
  void Give(std::shared_ptr<Conn> c) {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(std::move(c));
  }
};

namespace {

class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(HttpLoadClient::Impl* impl, const std::string& path, std::string body,
       std::function<void(HttpCallResult)> done, int64_t json_length)
      : impl_(impl), done_(std::move(done)) {
    req_.method(http::verb::post);
    req_.target(path);
    req_.version(11);
    req_.set(http::field::host, impl->host);
    if (json_length >= 0) {
      req_.set(http::field::content_type, "application/octet-stream");
      req_.set("Inference-Header-Content-Length", std::to_string(json_length));
    } else {
      req_.set(http::field::content_type, "application/json");
    }
    if (!impl->token.empty()) req_.set(http::field::authorization, "Bearer " + impl->token);
    req_.body() = std::move(body);
    req_.prepare_payload();
  }

  void Run() {
    start_ = Clock::now();
    if (!impl_->endpoint) return Fail("cannot resolve the server: " + impl_->resolve_error);
    Attempt(impl_->Take());
  }

 private:
  void Attempt(std::shared_ptr<Conn> conn) {
    conn_ = std::move(conn);
    reused_ = conn_->open;
    auto self = shared_from_this();
    net::dispatch(conn_->stream.get_executor(), [self] {
      if (self->conn_->open) return self->Write();
      self->conn_->stream.expires_after(std::chrono::seconds(10));
      self->conn_->stream.async_connect(*self->impl_->endpoint, [self](error_code ec) {
        if (ec) return self->Fail("connect: " + ec.message());
        self->conn_->open = true;
        self->Write();
      });
    });
  }

  void Write() {
    conn_->stream.expires_after(std::chrono::seconds(30));
    http::async_write(conn_->stream, req_, [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->Broken("write: " + ec.message());
      self->ReadHeader();
    });
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    // A stream's pieces are HTTP chunks (one per flush on the server): the gaps of a running
    // stream are those between the chunks that follow its first pixels.
    parser_->on_chunk_header(on_chunk_);
    conn_->stream.expires_after(std::chrono::seconds(900));
    http::async_read_header(conn_->stream, conn_->buffer, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) {
                              if (ec) return self->Broken("read: " + ec.message());
                              self->OnHeader();
                            });
  }

  // A kept-alive connection the server had closed meanwhile (its idle timeout): once, on a new
  // one; otherwise the call failed.
  void Broken(const std::string& what) {
    conn_->open = false;
    error_code ignored;
    conn_->stream.socket().close(ignored);
    if (reused_ && !retried_) {
      retried_ = true;
      return Attempt(std::make_shared<Conn>(impl_->ioc));
    }
    Fail(what);
  }

  void OnHeader() {
    r_.http_status = static_cast<int>(parser_->get().result_int());
    const auto type = parser_->get()[http::field::content_type];
    stream_ = r_.http_status == 200 && type.starts_with("text/event-stream");
    if (parser_->is_done()) return Finish();
    ReadMore();
  }

  void ReadMore() {
    http::async_read_some(conn_->stream, conn_->buffer, *parser_,
                          [self = shared_from_this()](error_code ec, size_t) {
                            if (ec) return self->Fail("read: " + ec.message());
                            if (self->stream_) self->Scan();
                            if (self->parser_->is_done()) return self->Finish();
                            self->ReadMore();
                          });
  }

  // The events that arrived whole since the last read.
  void Scan() {
    std::string& body = parser_->get().body();
    size_t at = 0;
    for (size_t end; (end = body.find("\n\n", at)) != std::string::npos; at = end + 2) {
      const std::string_view e(body.data() + at, end - at);
      if (e.substr(0, 1) == ":") continue;  // a keep-alive comment
      if (r_.first_event < 0) r_.first_event = Since(start_);
      if (e.substr(0, 12) == "event: error") {
        const size_t c = e.find("\"code\":\"");
        error_code_ = c == std::string_view::npos
                          ? "UNKNOWN"
                          : std::string(e.substr(c + 8, e.find('"', c + 8) - c - 8));
      } else if (e.find("\"type\":\"row\"") != std::string_view::npos ||
                 e.find("\"type\":\"image\"") != std::string_view::npos) {
        if (r_.first_pixel < 0) r_.first_pixel = Since(start_);
        if (e.find("\"type\":\"image\"") != std::string_view::npos) ++r_.images;
      } else if (e.find("\"type\":\"done\"") != std::string_view::npos) {
        saw_done_ = true;
      }
    }
    body.erase(0, at);
  }

  void Finish() {
    r_.seconds = Since(start_);
    if (r_.http_status != 200) {
      r_.code = CodeOfHttpStatus(r_.http_status);
      r_.error = parser_->get().body().substr(0, 300);
    } else if (stream_) {
      r_.code = !error_code_.empty() ? error_code_ : saw_done_ ? "OK" : "UNKNOWN";
      if (r_.code == "UNKNOWN") r_.error = "the stream ended without its done event";
    } else {
      r_.code = "OK";
    }
    if (parser_->get().keep_alive()) {
      impl_->Give(std::move(conn_));
    } else {
      error_code ignored;
      conn_->stream.socket().close(ignored);
    }
    Done();
  }

  void Fail(const std::string& what) {
    r_.seconds = Since(start_);
    if (r_.code.empty()) r_.code = "UNAVAILABLE";
    r_.error = what;
    if (conn_) {
      error_code ignored;
      conn_->stream.socket().close(ignored);
    }
    Done();
  }

  void Done() {
    auto done = std::move(done_);
    done(std::move(r_));
  }

  HttpLoadClient::Impl* impl_;
  std::function<void(HttpCallResult)> done_;
  http::request<http::string_body> req_;
  std::shared_ptr<Conn> conn_;
  std::function<void(uint64_t, beast::string_view, error_code&)> on_chunk_ =
      [this](uint64_t, beast::string_view, error_code&) {
        const Clock::time_point now = Clock::now();
        if (r_.first_pixel >= 0)
          r_.gaps.push_back(std::chrono::duration<double>(now - last_chunk_).count());
        last_chunk_ = now;
      };
  std::optional<http::response_parser<http::string_body>> parser_;  // after on_chunk_
  HttpCallResult r_;
  Clock::time_point start_, last_chunk_{};
  bool reused_ = false, retried_ = false, stream_ = false, saw_done_ = false;
  std::string error_code_;
};

}  // namespace

HttpLoadClient::HttpLoadClient(std::string host_port, std::string token, int threads)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(token);
  impl_->host = host_port;
  const size_t colon = host_port.rfind(':');
  tcp::resolver resolver(impl_->ioc);
  error_code ec;
  auto results = colon == std::string::npos ? tcp::resolver::results_type()
                                            : resolver.resolve(host_port.substr(0, colon),
                                                               host_port.substr(colon + 1), ec);
  if (colon == std::string::npos) {
    impl_->resolve_error = "--http_server must be host:port, got " + host_port;
  } else if (ec || results.empty()) {
    impl_->resolve_error = host_port + ": " + ec.message();
  } else {
    impl_->endpoint = results.begin()->endpoint();
  }
  for (int i = 0; i < std::max(1, threads); ++i)
    impl_->threads.emplace_back([ioc = &impl_->ioc] { ioc->run(); });
}

HttpLoadClient::~HttpLoadClient() {
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
}

void HttpLoadClient::Post(const std::string& path, std::string body,
                          std::function<void(HttpCallResult)> done, int64_t json_length) {
  std::make_shared<Call>(impl_.get(), path, std::move(body), std::move(done), json_length)->Run();
}

}  // namespace krause::client
