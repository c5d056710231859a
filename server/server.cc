#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "model/util/files.h"
#include "model/util/status_macros.h"
#include "server/core/repository.h"

namespace krause::server {
namespace {

// A TLS file named by `flag`; errors say which flag.
absl::StatusOr<std::string> ReadFlagFile(const std::string& path, const char* flag) {
  auto bytes = ReadFileToString(path);
  if (!bytes.ok())
    return absl::Status(bytes.status().code(), absl::StrCat(flag, " ", bytes.status().message()));
  return bytes;
}

// The TLS flags' files, read once for both ports (nullopt: no TLS).
absl::StatusOr<std::optional<HttpTls>> TlsFiles(const ServerOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty())
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  if (o.tls_cert.empty()) {
    if (!o.tls_client_ca.empty())
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    return std::nullopt;
  }
  HttpTls tls;
  auto cert = ReadFlagFile(o.tls_cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  tls.cert_pem = *std::move(cert);
  auto key = ReadFlagFile(o.tls_key, "--tls_key");
  if (!key.ok()) return key.status();
  tls.key_pem = *std::move(key);
  if (!o.tls_client_ca.empty()) {
    auto ca = ReadFlagFile(o.tls_client_ca, "--tls_client_ca");
    if (!ca.ok()) return ca.status();
    tls.client_ca_pem = *std::move(ca);
  }
  return tls;
}

std::shared_ptr<grpc::ServerCredentials> Credentials(const std::optional<HttpTls>& tls) {
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
  if (!tls->client_ca_pem.empty()) {
    ssl.pem_root_certs = tls->client_ca_pem;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

void KrauseServer::Log(const std::string& line) const {
  if (options_.quiet) return;
  std::fprintf(stderr, "%s krause-server: %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()).c_str(),
               line.c_str());
}

absl::StatusOr<std::unique_ptr<KrauseServer>> KrauseServer::Start(const ServerOptions& options,
                                                                  const WorkerHooks& hooks) {
  std::unique_ptr<KrauseServer> s(new KrauseServer());
  s->options_ = options;
  for (const auto& [flag, value] :
       {std::pair{"--max_connection_age_seconds", options.max_connection_age_seconds},
        {"--max_connection_age_grace_seconds", options.max_connection_age_grace_seconds},
        {"--keepalive_seconds", options.keepalive_seconds},
        {"--keepalive_timeout_seconds", options.keepalive_timeout_seconds}}) {
    if (!(value >= 0 && value <= 1e6))
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " must be in [0, 1000000] seconds, got ", value));
  }
  // The manifest and tokens are checked before anything listens.
  // --models_dir is a versioned repository (REPO/<name>/<version>/model.safetensors) or the
  // flat layout of the bundled models; a manifest names its checkpoints itself.
  auto mode = ParseModelControlMode(options.model_control);
  if (!mode.ok()) return mode.status();
  const bool repository = options.manifest.empty() && IsVersionedRepository(options.models_dir);
  if (!repository && *mode != ModelControlMode::kNone)
    return absl::InvalidArgumentError(absl::StrCat(
        "--model_control ", options.model_control,
        " needs a versioned repository in --models_dir (<name>/<version>/model.safetensors), "
        "not ",
        options.manifest.empty() ? "the flat layout of " + options.models_dir
                                 : std::string("--manifest")));
  if (!options.load_models.empty() && *mode != ModelControlMode::kExplicit)
    return absl::InvalidArgumentError(
        "--load_model needs a versioned repository and --model_control explicit (otherwise every "
        "model is loaded)");
  ModelControlOptions control;
  control.mode = *mode;
  control.repository = options.models_dir;
  control.poll_seconds = options.repository_poll_seconds;
  control.load_at_start = options.load_models;
  control.defaults.device = options.device;
  control.defaults.cuda_graphs = options.cuda_graphs;
  control.defaults.kernel_check = options.kernel_check;
  control.log = [p = s.get()](const std::string& line) { p->Log(line); };
  absl::StatusOr<std::vector<ModelSpec>> specs;  // without a repository
  if (!options.manifest.empty()) {
    specs = ReadManifest(options.manifest);
  } else if (repository) {
    auto scan = ScanRepository(options.models_dir, control.defaults);
    if (!scan.ok()) return scan.status();
    specs = std::vector<ModelSpec>();
  } else {
    specs = BundledManifest(options.models_dir, options.device, options.cuda_graphs);
  }
  if (!specs.ok()) return specs.status();
  for (ModelSpec& spec : *specs) spec.kernel_check = options.kernel_check;
  if (!options.auth_tokens_file.empty()) {  // the serving tokens, with their tenants
    auto text = ReadFileToString(options.auth_tokens_file);
    if (!text.ok()) return WithContext("--auth_tokens", text.status());
    auto tenants = TenantTable::Parse(*text, options.auth_tokens_file);
    if (!tenants.ok()) return WithContext("--auth_tokens", tenants.status());
    s->gate_.SetTenants(*std::move(tenants));
  }
  if (!options.admin_tokens_file.empty()) {
    auto tokens = ReadTokens(options.admin_tokens_file);
    if (!tokens.ok()) return WithContext("--admin_tokens", tokens.status());
    s->gate_.SetAdminTokens(std::move(*tokens));
  }
  auto tls = TlsFiles(options);
  if (!tls.ok()) return tls.status();
  const std::shared_ptr<grpc::ServerCredentials> creds = Credentials(*tls);

  std::set<std::string> metrics_tokens;
  if (!options.metrics_tokens_file.empty()) {
    auto tokens = ReadTokens(options.metrics_tokens_file);
    if (!tokens.ok()) return tokens.status();
    metrics_tokens.insert(tokens->begin(), tokens->end());
  }

  s->metrics_ = std::make_unique<Metrics>();
  s->metrics_->SetGate(&s->gate_);  // the gate outlives the metrics (declared first)
  if (!options.metrics_listen.empty()) {
    auto port = s->metrics_->Listen(options.metrics_listen, std::move(metrics_tokens));
    if (!port.ok()) return port.status();
    s->metrics_port_ = *port;
  }
  // Metrics first, then the caller's hooks.
  WorkerHooks chained = s->metrics_->Hooks();
  if (hooks.on_classify_batch)
    chained.on_classify_batch = [a = chained.on_classify_batch, b = hooks.on_classify_batch](
                                    const std::string& m, const BatchEvent& e) {
      a(m, e);
      b(m, e);
    };
  if (hooks.on_decode_step)
    chained.on_decode_step = [a = chained.on_decode_step, b = hooks.on_decode_step](
                                 const std::string& m, const DecodeEvent& e) {
      a(m, e);
      b(m, e);
    };

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  if (!options.request_log.empty()) {
    auto log = RequestLog::Open(options.request_log);
    if (!log.ok()) return log.status();
    s->request_log_ = std::move(*log);
  }
  // What the front ends share; each gets the same one.
  s->replies_ = std::make_unique<ReplyPool>(options.reply_threads);
  s->edge_.gate = &s->gate_;
  s->edge_.observer = s->metrics_.get();
  s->edge_.stats = &s->metrics_->stats();
  s->edge_.request_log = s->request_log_.get();
  s->edge_.replies = s->replies_.get();
  s->edge_.inspect_max_entries = options.inspect_max_entries;
  s->edge_.fault = options.fault_hook_for_test;
  s->service_ = std::make_unique<KrauseService>(&s->edge_);
  s->oip_service_ = std::make_unique<OipService>(&s->edge_);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, creds, &s->port_);
  builder.RegisterService(s->service_.get());
  builder.RegisterService(s->oip_service_.get());
  // A second server on the same port must fail, not silently share it (gRPC's default on Linux).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  auto ms = [](double seconds) { return static_cast<int>(std::min(seconds * 1e3, 2e9)); };
  if (options.max_connection_age_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               ms(options.max_connection_age_seconds));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               ms(options.max_connection_age_grace_seconds));
  }
  if (options.keepalive_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(options.keepalive_seconds));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                               ms(options.keepalive_timeout_seconds));
  }
  // Clients (client/connection.cc) ping idle connections every 60 s: allow pings that often.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  if (!(options.http_threads >= 1 && options.http_threads <= 64) ||
      !(options.http_timeout_ms >= 1 && options.http_timeout_ms <= 3600000) ||
      !(options.http_stream_ping_ms >= 100 && options.http_stream_ping_ms <= 3600000)) {
    s->server_->Shutdown(std::chrono::system_clock::now());
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_threads must be in [1, 64], --http_timeout_ms in [1, 3600000] and "
        "--http_stream_ping_ms in [100, 3600000], got ",
        options.http_threads, ", ", options.http_timeout_ms, " and ", options.http_stream_ping_ms));
  }
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  health->SetServingStatus(false);
  health->SetServingStatus(v1::KrauseService::service_full_name(), false);
  health->SetServingStatus(inference::GRPCInferenceService::service_full_name(), false);
  if (!options.http_listen.empty()) {
    // The HTTP port is the server's: each front end registers its routes on the front door.
    HttpFrontDoorOptions ho;
    ho.address = options.http_listen;
    ho.threads = options.http_threads;
    ho.request_timeout_ms = options.http_timeout_ms;
    ho.max_body_bytes = options.max_message_bytes;
    if (!options.http_plaintext) ho.tls = *tls;
    ho.not_found_hint = " (the APIs are under /v2 and /krause.v1.KrauseService/)";
    const int64_t deadline_ms =
        static_cast<int64_t>(std::clamp(options.http_deadline_seconds, 0.0, 1e7) * 1e3);
    s->oip_rest_ = std::make_unique<OipRest>(OipRestOptions{deadline_ms}, &s->edge_);
    s->connect_ = std::make_unique<ConnectHttp>(&s->edge_, deadline_ms);
    if (options.web_ui) s->web_ui_ = std::make_unique<WebUi>();
    HttpGenerationOptions go;
    go.ping_ms = options.http_stream_ping_ms;
    go.deadline_ms = deadline_ms;
    std::vector<HttpRoute> routes = {s->oip_rest_->Route(), HttpGenerationRoute(&s->edge_, go),
                                     s->connect_->Route(),
                                     OpenAiRoute(&s->edge_, {deadline_ms, go.ping_ms})};
    if (s->web_ui_)
      for (HttpRoute& r : s->web_ui_->Routes()) routes.push_back(std::move(r));
    auto http = HttpFrontDoor::Start(ho, std::move(routes), &s->edge_);
    if (!http.ok()) {
      s->server_->Shutdown(std::chrono::system_clock::now());
      return absl::Status(http.status().code(),
                          absl::StrCat("--http_listen: ", http.status().message()));
    }
    s->http_ = std::move(*http);
  }
  s->Log(absl::StrCat(
      "listening on port ", s->port_, options.tls_cert.empty() ? "" : " (TLS)",
      s->http_ ? absl::StrCat(", REST (v2) on port ", s->http_->port(),
                              !tls->has_value()        ? ""
                              : options.http_plaintext ? " (plain HTTP: --http_plaintext)"
                                                       : " (HTTPS)",
                              s->web_ui_ ? " with the web page at /" : "")
               : "",
      s->metrics_port_ ? absl::StrCat(", /metrics on port ", s->metrics_port_) : "", "; loading ",
      repository ? "the repository " + options.models_dir
                 : absl::StrCat(specs->size(), " model(s)")));

  if (s->http_ && tls->has_value() && options.http_plaintext)
    s->Log(absl::StrCat("warning: --http_plaintext: REST on port ", s->http_->port(),
                        " serves plain HTTP although TLS is on; bearer tokens and images cross "
                        "the network unencrypted"));

  if (repository) {
    // Model control loads the repository's policy versions (and later changes them).
    s->registry_ = std::make_unique<Registry>();
    control.hooks = chained;
    auto c = ModelControl::Start(std::move(control), s->registry_.get());
    if (!c.ok()) {
      s->server_->Shutdown(std::chrono::system_clock::now());
      return c.status();
    }
    s->model_control_ = std::move(*c);
    s->edge_.control.store(s->model_control_.get());
  } else {
    auto registry = Registry::Load(*specs, chained);
    if (!registry.ok()) {
      s->server_->Shutdown(std::chrono::system_clock::now());
      return registry.status();
    }
    s->registry_ = std::move(*registry);
  }
  for (const auto& m : s->registry_->models()) {
    const ModelInfo& i = m->info();
    s->Log(absl::StrCat("model ", i.name, " version ", i.version, ": ", ModelKindName(i.kind), " ",
                        AttentionKindName(i.attention), " ", i.shape.height, "x", i.shape.width,
                        "x", i.shape.channels, ", ", i.parameters, " parameters",
                        i.is_default ? ", default" : "", " (", m->checkpoint(), ")"));
    s->Log(KernelCheckLine(i));
  }
  s->metrics_->SetRegistry(s->registry_.get());
  s->edge_.registry.store(s->registry_.get());
  s->gate_.SetLoaded(true);
  health->SetServingStatus(v1::KrauseService::service_full_name(), true);
  health->SetServingStatus(inference::GRPCInferenceService::service_full_name(), true);
  health->SetServingStatus(true);
  s->Log("serving");
  return s;
}

KrauseServer::~KrauseServer() {
  Shutdown();
  if (metrics_) metrics_->SetRegistry(nullptr);  // the registry goes first
}

void KrauseServer::Shutdown() {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (!server_) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  gate_.StartDraining();
  const auto grace = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.drain_seconds));
  Log(absl::StrCat("draining: ", gate_.in_flight(), " call(s) in flight, grace ",
                   options_.drain_seconds, " s"));
  const bool idle = gate_.WaitIdle(std::chrono::steady_clock::now() + grace);
  if (!idle) Log(absl::StrCat("grace over: cancelling ", gate_.in_flight(), " call(s)"));
  // No load or unload from here on; workers cancel what is left, the calls finish with
  // UNAVAILABLE.
  if (model_control_) model_control_->Stop();
  if (registry_) registry_->Stop();
  gate_.WaitIdle(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  http_.reset();  // its workers have answered (the gate is idle): joins them
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  Log("stopped");
}

void KrauseServer::Wait() {
  if (server_) server_->Wait();
}

}  // namespace krause::server
