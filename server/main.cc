// krause-server: serves Krause ViT classifiers and KARM generators (and their softmax baselines)
// over gRPC. See --help and the API reference, docs/api.md.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "model/attention/cpu_kernels.h"
#include "model/util/help.h"
#include "model/util/threads.h"
#include "server/core/options.h"
#include "server/server.h"

namespace {
// The flags' defaults are ServerOptions' own, so that the two cannot disagree.
const krause::server::ServerOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, listen, kDefaults.listen,
          "address:port to serve gRPC on (port 0: any free port)");
ABSL_FLAG(std::string, manifest, "",
          "model manifest (JSON, see server/core/options.h); empty: every model in --models_dir");
ABSL_FLAG(std::string, models_dir, kDefaults.models_dir,
          "models to serve without --manifest: a folder of *.safetensors (the bundled models, "
          "version 1 each) or a versioned repository <name>/<version>/model.safetensors with "
          "optional <name>/config.json (serving options, version_policy); see docs/serving.md");
ABSL_FLAG(
    std::string, model_control, kDefaults.model_control,
    "a versioned repository's model control: none (the versions loaded at start-up "
    "serve until exit), poll (every --repository_poll_s the repository is rescanned and "
    "new, changed or removed versions are loaded or unloaded while serving) or explicit "
    "(the models --load_model names are loaded at start-up, then only LoadModel / UnloadModel "
    "and the repository extension change what serves); see docs/serving.md");
ABSL_FLAG(std::vector<std::string>, load_model, {},
          "--model_control explicit: a model to load at start-up (repeat it, or give a comma "
          "list; '*' for every model of the repository); none: the server starts with no model "
          "and LoadModel / RepositoryModelLoad add them");
ABSL_FLAG(double, repository_poll_s, kDefaults.repository_poll_seconds,
          "--model_control poll: seconds between scans of the repository");
ABSL_FLAG(std::string, device, kDefaults.device,
          "device of the --models_dir models: cpu, cuda or cuda:N (a repository's config.json or "
          "a manifest entry may set its own \"device\")");
ABSL_FLAG(bool, cuda_graphs, kDefaults.cuda_graphs,
          "bundled generators on a GPU: replay the KARM decode step as CUDA graphs (with "
          "--manifest each model sets its own \"cuda_graphs\")");
ABSL_FLAG(int32_t, threads, kDefaults.threads, "LibTorch intra-op threads (0: all cores)");
ABSL_FLAG(int32_t, reply_threads, kDefaults.reply_threads,
          "threads that build and send replies (protobuf, PNG), off the model threads");
ABSL_FLAG(int64_t, max_message_bytes, kDefaults.max_message_bytes,
          "largest request or response message in bytes");
ABSL_FLAG(
    double, drain_seconds, kDefaults.drain_seconds,
    "on SIGTERM/SIGINT: seconds in-flight calls may take to finish before they are cancelled");
ABSL_FLAG(double, max_connection_age_seconds, kDefaults.max_connection_age_seconds,
          "ask each client to reconnect after this many seconds (so that clients spread over "
          "replicas added since; 0: never)");
ABSL_FLAG(double, max_connection_age_grace_seconds, kDefaults.max_connection_age_grace_seconds,
          "calls in flight on a connection past its age get this many seconds more");
ABSL_FLAG(double, keepalive_seconds, kDefaults.keepalive_seconds,
          "ping idle client connections this often (0: off)");
ABSL_FLAG(double, keepalive_timeout_seconds, kDefaults.keepalive_timeout_seconds,
          "drop a connection whose ping is not answered within this many seconds");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve TLS on the gRPC port and HTTPS only on the REST port "
          "(with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mutual TLS, both ports)");
ABSL_FLAG(std::string, auth_tokens, "",
          "file of bearer tokens, one per line: calls need 'authorization: Bearer <token>'; "
          "after a token, its tenant and the tenant's share and limits: tenant=NAME weight=W "
          "max_in_flight=N max_queued=N max_slots=N max_priority=P (docs/serving.md, Tenants)");
ABSL_FLAG(std::string, admin_tokens, "",
          "file of bearer tokens, one per line, for model control (LoadModel, UnloadModel, "
          "RepositoryIndex; they serve too): with --auth_tokens, a serving token gets "
          "PERMISSION_DENIED there");
ABSL_FLAG(std::string, metrics_listen, kDefaults.metrics_listen,
          "address:port for Prometheus text metrics at /metrics (empty: off); every interface "
          "by default, so that Prometheus can scrape the pod: use 127.0.0.1:9464 or "
          "--metrics_tokens to keep it private");
ABSL_FLAG(std::string, http_listen, kDefaults.http_listen,
          "address:port for HTTP: the Open Inference Protocol's REST API (KServe v2: /v2/..., "
          "and generation streamed as Server-Sent Events: /v2/models/M/generate_stream), "
          "krause.v1's unary calls over the Connect protocol (/krause.v1.KrauseService/...) and "
          "the web page at / (--web_ui); empty: off. The gRPC services are always on --listen");
ABSL_FLAG(int, http_threads, kDefaults.http_threads,
          "REST: event-loop threads; together they hold every connection, idle, being read, "
          "waiting for its answer or streaming it (1 to 64)");
ABSL_FLAG(int, http_timeout_ms, kDefaults.http_timeout_ms,
          "REST: milliseconds to read a request's headers, then its body (else 408), and to write "
          "an answer or a piece of a stream (else the connection is dropped)");
ABSL_FLAG(double, http_deadline_seconds, kDefaults.http_deadline_seconds,
          "REST: an inference ends with 504 (its work stopped) after this many seconds unless its "
          "request's `timeout` parameter (microseconds) says sooner; 0: no default deadline");
ABSL_FLAG(bool, http_plaintext, kDefaults.http_plaintext,
          "REST: serve plain HTTP even with --tls_cert (tokens and images then cross the "
          "network unencrypted; the log says so). Without it, --tls_cert makes the REST port "
          "HTTPS only");
ABSL_FLAG(int, http_stream_ping_ms, kDefaults.http_stream_ping_ms,
          "REST: a generate_stream that has sent nothing for this many milliseconds sends a "
          "': ping' comment, so that proxies keep it open (100 to 3600000)");
ABSL_FLAG(bool, web_ui, kDefaults.web_ui,
          "REST: serve the web page at / (draw and classify, watch a generation row by row, see "
          "what attention keeps; docs/web.md); --web_ui=false: the REST port serves only the APIs");
ABSL_FLAG(std::string, metrics_tokens, "",
          "file of bearer tokens, one per line: scrapes need 'Authorization: Bearer <token>' "
          "(separate from --auth_tokens)");
ABSL_FLAG(int64_t, inspect_max_entries, kDefaults.inspect_max_entries,
          "the most keys an Inspect reply lists (queries x heads x keys per query, over its "
          "layers); a request for more is INVALID_ARGUMENT");
ABSL_FLAG(std::string, request_log, "",
          "one JSON line per finished call (rpc, model, code, images, queue and run seconds, "
          "peer, the caller's x-request-id / traceparent) to this file, '-' for stderr; empty: "
          "none");
ABSL_FLAG(std::string, kernel_check, "fallback",
          "before a model serves, its attention implementation runs on a small input at the "
          "model's shapes against the reference operator: fallback (serve the next "
          "implementation that passes: cuda, windowed, then the CPU's fused_cpu, windowed), "
          "strict (refuse a model whose first implementation fails), off (no check)");
ABSL_FLAG(bool, quiet, false, "no log lines on stderr");
ABSL_FLAG(std::string, port_file, "",
          "once serving, write the port listened on to this file (for scripts and --listen :0)");

namespace {
int g_signal_pipe[2] = {-1, -1};
void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &b, 1);
}
}  // namespace

int main(int argc, char** argv) {
  krause::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "serves Krause attention models over gRPC (krause.v1.KrauseService, health, reflection)\n"
      "and the Open Inference Protocol (KServe v2: inference.GRPCInferenceService on the gRPC\n"
      "port, REST on --http_listen, with the web page at /).\n"
      "  krause-server                       # the bundled models in ./models: gRPC on 50051,\n"
      "                                      # REST and the page on 8000, /metrics on 9464\n"
      "  krause-server --manifest m.json --listen 0.0.0.0:8500 --drain_seconds 30\n"
      "SIGTERM/SIGINT drain the server (health NOT_SERVING, in-flight calls get --drain_seconds)\n"
      "and it exits with code 0.");
  absl::ParseCommandLine(argc, argv);
  // --load_model may be repeated (Triton's --load-model is): Abseil keeps the last, so every
  // occurrence is collected here.
  std::vector<std::string> load_models;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") break;
    std::string value;
    if (a.rfind("--load_model=", 0) == 0 || a.rfind("-load_model=", 0) == 0) {
      value = std::string(a.substr(a.find('=') + 1));
    } else if ((a == "--load_model" || a == "-load_model") && i + 1 < argc) {
      value = argv[++i];
    } else {
      continue;
    }
    for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty()))
      load_models.emplace_back(part);
  }
  // SIGTERM / SIGINT: the handler (async-signal-safe) writes the signal number to a pipe; a
  // thread reads it and drains the server. (Threads that libraries start before main() would
  // escape a sigwait mask, so a handler it is.)
  if (pipe(g_signal_pipe) != 0) {
    std::perror("krause-server: pipe");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  krause::server::ServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.manifest = absl::GetFlag(FLAGS_manifest);
  o.models_dir = absl::GetFlag(FLAGS_models_dir);
  o.device = absl::GetFlag(FLAGS_device);
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.reply_threads = absl::GetFlag(FLAGS_reply_threads);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  o.max_connection_age_seconds = absl::GetFlag(FLAGS_max_connection_age_seconds);
  o.max_connection_age_grace_seconds = absl::GetFlag(FLAGS_max_connection_age_grace_seconds);
  o.keepalive_seconds = absl::GetFlag(FLAGS_keepalive_seconds);
  o.keepalive_timeout_seconds = absl::GetFlag(FLAGS_keepalive_timeout_seconds);
  o.request_log = absl::GetFlag(FLAGS_request_log);
  o.inspect_max_entries = absl::GetFlag(FLAGS_inspect_max_entries);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens);
  o.admin_tokens_file = absl::GetFlag(FLAGS_admin_tokens);
  o.model_control = absl::GetFlag(FLAGS_model_control);
  o.load_models = load_models.empty() ? absl::GetFlag(FLAGS_load_model) : load_models;
  o.repository_poll_seconds = absl::GetFlag(FLAGS_repository_poll_s);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.metrics_tokens_file = absl::GetFlag(FLAGS_metrics_tokens);
  o.http_listen = absl::GetFlag(FLAGS_http_listen);
  o.http_threads = absl::GetFlag(FLAGS_http_threads);
  o.http_timeout_ms = absl::GetFlag(FLAGS_http_timeout_ms);
  o.http_deadline_seconds = absl::GetFlag(FLAGS_http_deadline_seconds);
  o.http_plaintext = absl::GetFlag(FLAGS_http_plaintext);
  o.http_stream_ping_ms = absl::GetFlag(FLAGS_http_stream_ping_ms);
  o.web_ui = absl::GetFlag(FLAGS_web_ui);
  o.quiet = absl::GetFlag(FLAGS_quiet);
  if (auto mode = krause::server::ParseKernelCheckMode(absl::GetFlag(FLAGS_kernel_check));
      mode.ok()) {
    o.kernel_check = *mode;
  } else {
    std::fprintf(stderr, "krause-server: %s\n", std::string(mode.status().message()).c_str());
    return 2;
  }
  if (o.reply_threads < 1 || o.reply_threads > 64) {
    std::fprintf(stderr, "krause-server: --reply_threads must be in [1, 64], got %d\n",
                 o.reply_threads);
    return 2;
  }
  if (o.inspect_max_entries < 1) {
    std::fprintf(stderr, "krause-server: --inspect_max_entries must be >= 1, got %lld\n",
                 static_cast<long long>(o.inspect_max_entries));
    return 2;
  }
  if (const char* e = krause::cpu::CpuKernelsChoiceError(); *e != '\0') {
    std::fprintf(stderr, "krause-server: %s\n", e);
    return 2;
  }
  krause::SetCpuThreads(o.threads);

  auto server = krause::server::KrauseServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "krause-server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    // Written whole under a temporary name, then renamed: readers never see a partial file.
    const std::string tmp = port_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr || std::fprintf(f, "%d\n", (*server)->port()) < 0 || std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      std::fprintf(stderr, "krause-server: cannot write --port_file %s\n", port_file.c_str());
      return 1;
    }
  }
  std::thread waiter([&] {
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (!o.quiet) std::fprintf(stderr, "krause-server: signal %d, shutting down\n", sig);
    (*server)->Shutdown();
  });
  (*server)->Wait();
  waiter.join();
  return 0;
}
