// A blocking HTTPS client for the tests (Boost.Asio over OpenSSL): one request on a fresh
// connection to 127.0.0.1, everything the server sends until it closes.
#pragma once

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <string>

namespace krause::testing {

struct HttpsResult {
  bool handshake_ok = false;
  std::string error;     // the handshake's or the read's error, if any
  std::string received;  // what the server sent (status line, headers, body)
};

// `ca`: the PEM file the server's certificate must chain to (checked, with its name
// "localhost"); `cert`/`key`: a client certificate to present (empty: none).
inline HttpsResult HttpsRequest(int port, const std::string& request, const std::string& ca,
                                const std::string& cert = "", const std::string& key = "") {
  namespace net = boost::asio;
  HttpsResult out;
  net::io_context ioc;
  net::ssl::context ctx(net::ssl::context::tls_client);
  boost::system::error_code ec;
  ctx.load_verify_file(ca, ec);
  if (!cert.empty()) ctx.use_certificate_chain_file(cert, ec);
  if (!key.empty()) ctx.use_private_key_file(key, net::ssl::context::pem, ec);
  if (ec) {
    out.error = "client setup: " + ec.message();
    return out;
  }
  ctx.set_verify_mode(net::ssl::verify_peer);
  net::ssl::stream<net::ip::tcp::socket> s(ioc, ctx);
  s.set_verify_callback(net::ssl::host_name_verification("localhost"));
  s.next_layer().connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)},
                         ec);
  if (ec) {
    out.error = "connect: " + ec.message();
    return out;
  }
  timeval tv{10, 0};  // a server that never answers fails the test, not hangs it
  setsockopt(s.next_layer().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  s.handshake(net::ssl::stream_base::client, ec);
  if (ec) {
    out.error = "handshake: " + ec.message();
    return out;
  }
  out.handshake_ok = true;
  net::write(s, net::buffer(request), ec);
  char buf[4096];
  while (!ec) {
    const size_t n = s.read_some(net::buffer(buf), ec);
    out.received.append(buf, n);
  }
  if (ec != net::error::eof && ec != net::ssl::error::stream_truncated) out.error = ec.message();
  return out;
}

}  // namespace krause::testing
