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

struct ConnectionOptions {
  std::string server = "localhost:50051";
  bool tls = false;               // TLS with the system roots (or tls_ca)
  std::string tls_ca;             // PEM roots to verify the server with (implies tls)
  std::string tls_cert, tls_key;  // client certificate for mutual TLS (implies tls)
  std::string tls_server_name;    // override the name checked against the certificate
  std::string token;              // bearer token sent as "authorization: Bearer <token>"
  int64_t max_message_bytes = 64 << 20;
  double timeout_seconds = 0;  // per call; 0: none
};

// `channel_index` > 0 gives a channel its own connection (distinct channel arguments), so
// several channels spread calls over several connections.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ConnectionOptions& o,
                                                           int channel_index = 0);
// Adds the token and the deadline to a call's context.
void PrepareContext(const ConnectionOptions& o, grpc::ClientContext* ctx);
// "INVALID_ARGUMENT: images[0]: ..." plus a hint for the codes a user can act on.
std::string Explain(const grpc::Status& status, const ConnectionOptions& o);

}  // namespace krause::client
