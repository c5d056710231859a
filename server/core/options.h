// The server's configuration: one options struct built from the flags (server/main.cc), and the
// model manifest it names. Thread-safety: plain data.
//
// Manifest (JSON):
//   {"models": [
//     {"name": "fmnist-krause-vit", "checkpoint": "models/krause_vit_fmnist.safetensors",
//      "device": "cpu", "default": true,
//      "max_batch_size": 64, "max_queue_delay_ms": 0, "max_queued_images": 1024,
//      "max_images_per_request": 64},
//     {"name": "fmnist-karm", "checkpoint": "models/karm_fmnist.safetensors",
//      "max_sequences": 64, "max_waiting": 256, "max_images_per_request": 16,
//      "cuda_graphs": false, "kv_cache_dtype": "float32", "attention_impl": "auto",
//      "weights_dtype": "float32", "precision": "fp32"}]}
// Relative checkpoint paths are resolved against the manifest's folder. Unknown keys are an
// error (a typo must not silently change a limit).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/precision.h"
#include "server/core/defaults.h"

namespace krause::server {

// A KARM's ring caches' dtype (keys and values; bf16 and fp16 on a GPU only): the manifest's
// "kv_cache_dtype", parsed once by ParseManifest.
enum class KvCacheDtype { kFloat32, kBFloat16, kFloat16 };
const char* KvCacheDtypeName(KvCacheDtype dtype);  // "float32", "bfloat16", "float16"

// A model's linear layers' weights as served (ParameterStore::RoundLinear): the manifest's
// "weights_dtype". bfloat16 rounds them once at load; every implementation then computes with the
// rounded weights, and the packed CPU paths read half the bytes.
enum class WeightsDtype { kFloat32, kBFloat16 };
const char* WeightsDtypeName(WeightsDtype dtype);  // "float32", "bfloat16"

// A generator's sampling defaults: what a Generate request (either protocol) that leaves a field
// unset gets. From the checkpoint's metadata ("sampling_defaults", a JSON object with these keys)
// and the manifest entry or config.json (the same keys), the latter winning key by key.
struct SamplingDefaults {
  std::optional<double> temperature, top_p, guidance;  // guidance: for requests with a class
  std::optional<int64_t> top_k;                        // a request's top_k of 0 means unset
  bool empty() const { return !temperature && !top_p && !guidance && !top_k; }
};
// Reads the four keys of `obj` (absent keys leave *out as it is); a value that is not a number
// (an integer for top_k) is InvalidArgument naming `where` and the key. Ranges are the model's
// business (ServedGenerator checks them with the request's rules).
absl::Status ReadSamplingDefaults(const nlohmann::json& obj, const std::string& where,
                                  SamplingDefaults* out);

// What the load-time kernel check (model/engine/kernel_check.h) does with a model whose first
// implementation fails it (the server's --kernel_check): fallback (serve the next that passes),
// strict (refuse the model), off (no check: serve the first, unchecked).
enum class KernelCheckMode { kFallback, kStrict, kOff };
const char* KernelCheckModeName(KernelCheckMode mode);  // "fallback", "strict", "off"
absl::StatusOr<KernelCheckMode> ParseKernelCheckMode(const std::string& name);

struct ModelSpec {
  std::string name;        // [A-Za-z0-9._-]{1,64}, unique
  std::string checkpoint;  // safetensors file written by krause-train / tools/convert_pth.py
  int64_t version = 1;     // a repository's version folder; 1 for a manifest or the flat layout
  std::string device = "cpu";
  bool is_default = false;  // the default of its kind (at most one per kind; else the first)
  // Classifiers: the dynamic batcher.
  int64_t max_batch_size = defaults::kMaxBatchSize;  // images per batch (and per request)
  // How long the first request of a batch may wait for company. 0 (default): natural batching,
  // no wait; raise it only when requests arrive faster than one forward takes but not together
  // (scheduling.h).
  int64_t max_queue_delay_ms = 0;
  int64_t max_queued_images = defaults::kMaxQueuedImages;  // beyond, Classify is UNAVAILABLE
  // Generators: the decode engine.
  int64_t max_sequences = defaults::kMaxSequences;  // cache slots (sequences in one step)
  int64_t max_waiting = defaults::kMaxWaiting;  // images waiting for a slot; beyond, UNAVAILABLE
  bool cuda_graphs = false;  // a KARM on a GPU: replay its decode step as CUDA graphs
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kFloat32;  // a KARM: bf16 anywhere, fp16 on a GPU
  WeightsDtype weights_dtype = WeightsDtype::kFloat32;   // either kind, any device
  // The arithmetic of the CPU forward (model/precision.h): fp32 (exact, portable bits) or bf16
  // (the linear layers' GEMMs in bfloat16 through oneDNN, weights rounded once at load, as
  // "weights_dtype": "bfloat16" rounds them; CPUs without AMX fall back to fp32
  // and the model says so). Classifiers; a generator refuses bf16 for now.
  Precision precision = Precision::kFp32;
  // Images per Classify / Generate / Score request (0: max_batch_size for classifiers, 16 for
  // generators: defaults::kGeneratorImagesPerRequest; each kind's ImagesPerRequest applies it,
  // served_classifier.h / served_generator.h). A classifier's may not exceed its max_batch_size
  // (a request is never split). Every value must have its JSON type (integers,
  // booleans, strings: no conversion); a wrong type is an error naming the entry and the key.
  int64_t max_images_per_request = 0;
  // Generators: sampling defaults ("temperature", "top_p", "top_k", "guidance"), over the
  // checkpoint's own.
  SamplingDefaults sampling;
  // "attention_impl": auto (the kernel check's choice) or one implementation to serve on, the
  // operator's escape hatch (cuda, fused_cpu, windowed: kServingImplNames,
  // model/engine/kernel_check.h). Forced, it is still checked; failing, the model is not served.
  std::string attention_impl = "auto";
  // The server's --kernel_check (not a manifest key).
  KernelCheckMode kernel_check = KernelCheckMode::kFallback;
};

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";  // host:port; port 0 picks a free one
  std::string manifest;                  // empty: the bundled models in `models_dir`
  std::string models_dir = "models";
  std::string device = "cpu";            // the bundled models' device (a manifest sets its own)
  bool cuda_graphs = false;              // the bundled generators' "cuda_graphs"
  int threads = 0;                       // LibTorch intra-op threads (0: all cores)
  int reply_threads = 1;                 // threads that build and send replies (ReplyPool)
  int64_t max_message_bytes = 64 << 20;  // largest request and response message
  double drain_seconds = 20;             // SIGTERM: how long in-flight calls may finish
  // Connections: after max_connection_age_seconds the server asks a client to reconnect (a GOAWAY;
  // calls in flight get max_connection_age_grace_seconds more), so that clients re-resolve and
  // spread over replicas added since (0: never). Keepalive pings every keepalive_seconds on idle
  // connections, dropped after keepalive_timeout_seconds without an answer (0: off).
  double max_connection_age_seconds = 300;
  double max_connection_age_grace_seconds = 60;
  double keepalive_seconds = 60;
  double keepalive_timeout_seconds = 20;
  // TLS: both or neither; with tls_client_ca, clients must present a certificate it signed.
  std::string tls_cert, tls_key, tls_client_ca;
  std::string auth_tokens_file;  // one token per line ('#' comments); empty: no auth
  // Tokens for model control (LoadModel, UnloadModel, RepositoryIndex); they serve too. With
  // auth_tokens and no admin tokens, model control is refused to every token.
  std::string admin_tokens_file;
  // A versioned repository's model control (model_control.h): none, poll or explicit.
  std::string model_control = "none";
  // --model_control explicit: the models loaded at start-up ("*": all); none named: none.
  std::vector<std::string> load_models;
  double repository_poll_seconds = 10;
  // host:port for Prometheus /metrics; empty: off. Every interface by default, so that
  // Prometheus can scrape a pod.
  std::string metrics_listen = "0.0.0.0:9464";
  std::string metrics_tokens_file;  // tokens a scrape must send as a bearer token; empty: none
  // host:port for the Open Inference Protocol's REST API (oip_http.h); empty: off.
  std::string http_listen = "0.0.0.0:8000";
  int http_threads = 2;        // REST: event-loop threads (they hold every connection)
  int http_timeout_ms = 5000;  // REST: to read a request (headers and body) and write a reply
  // REST: an inference's deadline when its request sets no `timeout` parameter; 0: none.
  double http_deadline_seconds = 600;
  // REST with tls_cert/tls_key: HTTPS (the same certificate; client certificates with
  // tls_client_ca). http_plaintext serves plain HTTP there anyway (logged as such).
  bool http_plaintext = false;
  // REST: a `: ping` comment on a generate_stream that has sent nothing for this long.
  int http_stream_ping_ms = 15000;
  // The web page at / on the REST port (server/web/web_ui.h).
  bool web_ui = true;
  // One JSON line per finished call (server/edge/request_log.h) to this file, "-" for stderr;
  // empty: none.
  std::string request_log;
  // The most keys an Inspect reply lists (queries x heads x keys per query, over its layers).
  int64_t inspect_max_entries = defaults::kInspectMaxEntries;
  // Before a model serves: check its implementation against the reference (KernelCheckMode).
  KernelCheckMode kernel_check = KernelCheckMode::kFallback;
  bool quiet = false;
  // Tests only (no flag): see KrauseService's fault hook.
  std::function<void(const char* point)> fault_hook_for_test;
};

// The serving options a manifest entry (or a repository's config.json) may set, read from the
// JSON object `entry` into *spec (keys absent keep its values) and checked: every value its JSON
// type, every limit in range; a key that is neither a serving option nor in `extra_keys` is an
// error. Errors name `where` and the key.
absl::Status ReadServingOptions(const nlohmann::json& entry, const std::string& where,
                                const std::set<std::string>& extra_keys, ModelSpec* spec);
// [A-Za-z0-9._-]{1,64}
bool ValidModelName(const std::string& name);

// Parses a manifest; relative checkpoint paths are resolved against `base_dir`.
absl::StatusOr<std::vector<ModelSpec>> ParseManifest(const std::string& json,
                                                     const std::string& base_dir);
absl::StatusOr<std::vector<ModelSpec>> ReadManifest(const std::string& path);
// The bundled default models: every *.safetensors in `dir`, named after the file (underscores
// become dashes), the Krause models the defaults, all on `device`, with `cuda_graphs`.
absl::StatusOr<std::vector<ModelSpec>> BundledManifest(const std::string& dir,
                                                       const std::string& device = "cpu",
                                                       bool cuda_graphs = false);
// Tokens from a file: one per line, blank lines and '#' comments ignored; at least one.
absl::StatusOr<std::vector<std::string>> ReadTokens(const std::string& path);

}  // namespace krause::server
