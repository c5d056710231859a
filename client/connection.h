// Client-side connection settings shared by krause-client, krause-loadgen and the tests: the
// channel (plain or TLS, optional client certificate), the bearer token, message-size limits,
// and readable explanations of error statuses. Thread-safety: plain data and pure functions.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace krause::client {

// The codes a call is tried again on, on another address: UNAVAILABLE (a replica gone, draining,
// restarting or full) and CANCELLED from the server (a replica shutting down cancels the calls
// that reach it meanwhile; the client's own cancel is never retried). The one list: the
// channel's retry policy (ServiceConfigJson) and the resuming Generate (resume.h) read it.
inline constexpr grpc::StatusCode kRetryableCodes[] = {grpc::StatusCode::UNAVAILABLE,
                                                       grpc::StatusCode::CANCELLED};
bool RetryableCode(grpc::StatusCode code);

struct ConnectionOptions {
  // Any gRPC target: host:port, dns:///name:port (every address the name resolves to, e.g. a
  // headless Kubernetes Service), ipv4:a:p,b:p. Calls are spread round-robin over the addresses.
  std::string server = "localhost:50051";
  // Retry the kRetryableCodes on another address, up to 4 attempts with backoff from 50 ms, or
  // after the
  // server's pushback (its RetryInfo): ListModels, GetModel, Classify and Score, and Generate
  // before its first message (gRPC commits a call once the server answered).
  bool retry = false;
  bool tls = false;               // TLS with the system roots (or tls_ca)
  std::string tls_ca;             // PEM roots to verify the server with (implies tls)
  std::string tls_cert, tls_key;  // client certificate for mutual TLS (implies tls)
  std::string tls_server_name;    // override the name checked against the certificate
  std::string token;              // bearer token sent as "authorization: Bearer <token>"
  int64_t max_message_bytes = 64 << 20;
  double timeout_seconds = 0;  // per call; 0: none
};

// `channel_index` > 0 gives a channel its own connection (distinct channel arguments), so
// several channels spread calls over several connections. The channel pings idle connections
// every 60 s (the server allows that; server/server.cc).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ConnectionOptions& o,
                                                           int channel_index = 0);
// The channel's service config: round robin, and with `retry` the retry policy above.
std::string ServiceConfigJson(bool retry);
// Adds the token and the deadline to a call's context.
void PrepareContext(const ConnectionOptions& o, grpc::ClientContext* ctx);
// "INVALID_ARGUMENT: images[0]: ..." plus a hint for the codes a user can act on.
std::string Explain(const grpc::Status& status, const ConnectionOptions& o);

}  // namespace krause::client
