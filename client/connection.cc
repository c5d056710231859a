#include "client/connection.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <chrono>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "model/util/files.h"
#include "server/edge/status.h"

namespace krause::client {

bool RetryableCode(grpc::StatusCode code) {
  return std::find(std::begin(kRetryableCodes), std::end(kRetryableCodes), code) !=
         std::end(kRetryableCodes);
}

std::string ServiceConfigJson(bool retry) {
  // Round robin over every resolved address (gRPC's default, pick_first, would send every call
  // to the first one).
  std::string json = R"({"loadBalancingConfig": [{"round_robin": {}}])";
  if (retry) {
    json += R"(, "methodConfig": [{"name": [)";
    const char* methods[] = {"ListModels", "GetModel", "Classify", "Score", "Generate"};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); ++i) {
      json += absl::StrCat(i ? ", " : "", R"({"service": "krause.v1.KrauseService", "method": ")",
                           methods[i], R"("})");
    }
    json += R"(], "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.05s", )"
            R"("maxBackoff": "1s", "backoffMultiplier": 2, )"
            R"("retryableStatusCodes": [)";
    for (size_t i = 0; i < std::size(kRetryableCodes); ++i)
      json += absl::StrCat(i ? ", " : "", "\"", server::GrpcCodeName(kRetryableCodes[i]), "\"");
    json += "]}}]";
  }
  return json + "}";
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ConnectionOptions& o,
                                                           int channel_index) {
  grpc::ChannelArguments args;
  if (channel_index > 0) args.SetInt("krause.channel_index", channel_index);
  args.SetServiceConfigJSON(ServiceConfigJson(o.retry));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  args.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(o.max_message_bytes));
  std::shared_ptr<grpc::ChannelCredentials> creds;
  const bool tls = o.tls || !o.tls_ca.empty() || !o.tls_cert.empty();
  if (!tls) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    if (!o.tls_ca.empty()) {
      auto ca = ReadFileToString(o.tls_ca);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    if (o.tls_cert.empty() != o.tls_key.empty())
      return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
    if (!o.tls_cert.empty()) {
      auto cert = ReadFileToString(o.tls_cert);
      if (!cert.ok()) return cert.status();
      auto key = ReadFileToString(o.tls_key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(ssl);
    if (!o.tls_server_name.empty()) args.SetSslTargetNameOverride(o.tls_server_name);
  }
  return grpc::CreateCustomChannel(o.server, creds, args);
}

void PrepareContext(const ConnectionOptions& o, grpc::ClientContext* ctx) {
  if (!o.token.empty()) ctx->AddMetadata("authorization", "Bearer " + o.token);
  if (o.timeout_seconds > 0)
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          std::chrono::duration<double>(o.timeout_seconds)));
}

std::string Explain(const grpc::Status& status, const ConnectionOptions& o) {
  std::string s =
      absl::StrCat(server::GrpcCodeName(status.error_code()), ": ", status.error_message());
  // The server's error details say which field, and why a refusal happened.
  const server::ErrorDetails d = server::DetailsOf(status);
  for (const auto& [field, description] : d.fields)
    absl::StrAppend(&s, "\n  (the request's field: ", field, ")");
  if (!d.reason.empty()) {
    absl::StrAppend(&s, "\n  (reason ", d.reason);
    if (d.retry_delay) absl::StrAppend(&s, "; retry after ", d.retry_delay->count(), " ms");
    absl::StrAppend(&s, ")");
  }
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      if (!d.reason.empty()) break;
      absl::StrAppend(&s, "\n  (the server at ", o.server,
                      " is not reachable, still loading, shutting down or full: retry later)");
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      absl::StrAppend(&s, "\n  (the server requires a token: pass --token or --token_file)");
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      absl::StrAppend(&s, "\n  (the call took longer than --timeout=", o.timeout_seconds, " s)");
      break;
    case grpc::StatusCode::NOT_FOUND:
      absl::StrAppend(&s, "\n  (`krause-client list` shows the models this server has)");
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      absl::StrAppend(&s, "\n  (a message is over the size limit: send fewer images per call)");
      break;
    default:
      break;
  }
  return s;
}

}  // namespace krause::client
