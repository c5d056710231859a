// krause-loadgen: load tests krause-server with asynchronous calls over several channels.
//
//   krause-loadgen --workload classify --concurrency 32 --duration 20
//   krause-loadgen --workload generate --concurrency 64 --requests 128
//   krause-loadgen --mode open --rate 200 --arrivals poisson --workload mix --mix_classify 0.9
//   krause-loadgen --workload complete --prompt_rows 14 --concurrency 64 --requests 64
//   krause-loadgen --workload score --images_per_request 16 --concurrency 6 --duration 10
//   krause-loadgen --protocol oip --workload classify --concurrency 32 --duration 10
//   krause-loadgen --protocol http --workload generate --concurrency 64 --requests 128
//
// --protocol oip sends the same workloads (classify, score, generate) as the Open Inference
// Protocol's ModelInfer on inference.GRPCInferenceService (raw tensors; generate as one unary
// call per request, so without the stream's chunk figures) instead of krause.v1. --protocol http
// sends classify as the REST API's infer (JSON tensors) and generate as generate_stream (Server-
// Sent Events, with the stream's figures) to --http_server, over kept-alive connections
// (client/http_load.h).
//
// Closed loop: --concurrency calls always in flight (each finished call starts the next).
// Open loop: calls start at --rate per second (constant spacing or Poisson), however many are
// in flight. Reports throughput, latency percentiles, time to the first message and to the first
// pixels and the gaps between a running stream's chunks, errors by status code; --metrics HOST:PORT
// also scrapes the server's /metrics before and after and reports the server's view (FLOP savings,
// batch sizes). SIGINT or SIGTERM ends the load early: no new calls, the ones in flight finish, the
// report covers what was measured.
//
// This file reads the flags, makes the channels and the images, and runs the loop; the calls are
// loadgen.h's LoadGen through one driver a protocol (loadgen_drivers.h: loadgen_krause.cc,
// loadgen_oip.cc, loadgen_http.cc), the report is loadgen_report.cc's.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/connection.h"
#include "client/http_get.h"
#include "client/http_load.h"
#include "client/loadgen.h"
#include "client/loadgen_drivers.h"
#include "client/loadgen_report.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "krause/v1/krause.grpc.pb.h"
#include "model/data/idx.h"
#include "model/util/help.h"
#include "server/v1/raw_image.h"

ABSL_FLAG(std::string, server, "localhost:50051",
          "server: host:port or any gRPC target (dns:///name:port, ipv4:a:p,b:p: calls are "
          "spread round-robin over its addresses)");
ABSL_FLAG(bool, retry, false,
          "retry UNAVAILABLE up to 4 attempts (off by default: the report counts what the "
          "servers answered)");
ABSL_FLAG(bool, resume, false,
          "Generate: resume a broken stream on the next address from the rows received "
          "(client/resume.h, as krause-client does; off by default: the report counts what the "
          "servers answered). The report counts resumed streams and rows recomputed");
ABSL_FLAG(std::string, token, "", "bearer token");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots to verify the server with (enables TLS)");
ABSL_FLAG(std::string, protocol, "krause",
          "krause (krause.v1), oip (the Open Inference Protocol's ModelInfer over gRPC), http "
          "(REST infer and generate_stream on --http_server; plain HTTP) or openai (generate as "
          "OpenAI's POST /v1/images/generations on --http_server)");
ABSL_FLAG(std::string, http_server, "localhost:8000",
          "--protocol http or openai: the REST port, host:port");
ABSL_FLAG(bool, http_binary, false,
          "--protocol http, classify: the images and the outputs as binary tensor data (the "
          "Open Inference Protocol's binary tensor data extension, tritonclient.http's default) "
          "instead of JSON arrays");
ABSL_FLAG(std::string, mode, "closed", "closed (fixed concurrency) or open (fixed arrival rate)");
ABSL_FLAG(int32_t, concurrency, 32, "closed loop: calls in flight");
ABSL_FLAG(double, rate, 50, "open loop: calls started per second");
ABSL_FLAG(std::string, arrivals, "poisson", "open loop: constant or poisson");
ABSL_FLAG(double, duration, 10,
          "seconds of measured load (after the warm-up); ignored with --requests");
ABSL_FLAG(int64_t, requests, 0, "measured calls to make (0: run for --duration)");
ABSL_FLAG(double, warmup, 2,
          "seconds of load before measuring (calls started then are not counted)");
ABSL_FLAG(std::string, workload, "classify",
          "classify, generate, complete (Generate with the first --prompt_rows rows of a test "
          "image as the prompt), score, getmodel (the RPC floor: GetModel of "
          "--classify_model, no model runs) or mix (classify and generate)");
ABSL_FLAG(double, mix_classify, 0.8, "mix: fraction of calls that are Classify");
ABSL_FLAG(std::string, classify_model, "", "model for Classify (empty: the default classifier)");
ABSL_FLAG(std::string, generate_model, "", "model for Generate (empty: the default generator)");
ABSL_FLAG(int32_t, images_per_request, 1, "Classify and Score: images per call");
ABSL_FLAG(int32_t, prompt_rows, 14, "complete: rows of the prompt");
ABSL_FLAG(int32_t, update_interval_ms, 50, "Generate: the stream's update interval");
ABSL_FLAG(int32_t, generate_images, 1, "Generate: images per call");
ABSL_FLAG(std::string, data, "fashion-mnist",
          "classify and score images: fashion-mnist (the Debian package's test set) or synthetic "
          "(random pixels of the model's shape, which GetModel tells: a 224x224x3 model gets "
          "224x224x3 images)");
ABSL_FLAG(int32_t, channels, 4, "gRPC channels the calls are spread over");
ABSL_FLAG(std::string, metrics, "", "server /metrics address host:port to scrape before and after");
ABSL_FLAG(std::string, json, "", "write the report as JSON to this file ('-': stdout)");
ABSL_FLAG(bool, progress, true, "progress line with ETA on stderr");
ABSL_FLAG(int32_t, priority, 0, "krause.v1 Classify and Generate: the calls' priority (0 .. 2)");
ABSL_FLAG(std::string, tenants, "",
          "several tenants in one run (closed loop, --protocol krause), comma-separated "
          "NAME:TOKEN:CONCURRENCY[:WORKLOAD[:IMAGES[:PRIORITY]]] (IMAGES: per Classify or Score "
          "call, or per Generate call); each tenant's figures are reported apart, under "
          "\"tenants\" in --json. The other flags are every tenant's defaults");

namespace {

namespace v1 = krause::v1;
using krause::loadgen::Clock;
using krause::loadgen::Seconds;

// SIGINT / SIGTERM: stop starting calls, let those in flight end, report what was measured.
std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted.store(true); }

// The flags the calls are built from.
krause::loadgen::LoadOptions LoadOptionsFromFlags() {
  krause::loadgen::LoadOptions o;
  o.workload = absl::GetFlag(FLAGS_workload);
  o.mix_classify = absl::GetFlag(FLAGS_mix_classify);
  o.classify_model = absl::GetFlag(FLAGS_classify_model);
  o.generate_model = absl::GetFlag(FLAGS_generate_model);
  o.images_per_request = absl::GetFlag(FLAGS_images_per_request);
  o.prompt_rows = absl::GetFlag(FLAGS_prompt_rows);
  o.update_interval_ms = absl::GetFlag(FLAGS_update_interval_ms);
  o.generate_images = absl::GetFlag(FLAGS_generate_images);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.http_binary = absl::GetFlag(FLAGS_http_binary);
  o.priority = absl::GetFlag(FLAGS_priority);
  return o;
}

// One tenant's load: its token, calls in flight and workload (--tenants; without it one unnamed
// tenant of the flags).
struct TenantLoad {
  std::string name, token;
  int concurrency = 1;
  krause::loadgen::LoadOptions options;
};

bool KnownWorkload(const std::string& w) {
  return w == "classify" || w == "generate" || w == "complete" || w == "score" || w == "getmodel" ||
         w == "mix";
}

// --tenants: NAME:TOKEN:CONCURRENCY[:WORKLOAD[:IMAGES[:PRIORITY]]], comma-separated.
absl::StatusOr<std::vector<TenantLoad>> ParseTenants(const std::string& spec,
                                                     const krause::loadgen::LoadOptions& base) {
  std::vector<TenantLoad> out;
  for (absl::string_view one : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::vector<std::string> f = absl::StrSplit(one, ':');
    TenantLoad t;
    t.options = base;
    int n = 0;
    if (f.size() < 3 || f.size() > 6 || f[0].empty() || !absl::SimpleAtoi(f[2], &t.concurrency) ||
        t.concurrency < 1)
      return absl::InvalidArgumentError(absl::StrCat(
          "--tenants: \"", one, "\" is not NAME:TOKEN:CONCURRENCY[:WORKLOAD[:IMAGES[:PRIORITY]]]"));
    t.name = f[0];
    t.token = f[1];
    if (f.size() > 3) {
      if (!KnownWorkload(f[3]))
        return absl::InvalidArgumentError(absl::StrCat("--tenants: ", t.name, ": workload \"", f[3],
                                                       "\" is not one of classify, "
                                                       "generate, complete, score, getmodel, mix"));
      t.options.workload = f[3];
    }
    if (f.size() > 4) {
      if (!absl::SimpleAtoi(f[4], &n) || n < 1)
        return absl::InvalidArgumentError(
            absl::StrCat("--tenants: ", t.name, ": IMAGES must be a positive integer"));
      t.options.images_per_request = n;
      t.options.generate_images = n;
    }
    if (f.size() > 5) {
      if (!absl::SimpleAtoi(f[5], &n) || n < 0)
        return absl::InvalidArgumentError(
            absl::StrCat("--tenants: ", t.name, ": PRIORITY must be 0 or more"));
      t.options.priority = n;
    }
    for (const TenantLoad& o : out)
      if (o.name == t.name)
        return absl::InvalidArgumentError(absl::StrCat("--tenants: ", t.name, " is named twice"));
    out.push_back(std::move(t));
  }
  if (out.empty()) return absl::InvalidArgumentError("--tenants names no tenant");
  return out;
}

// The shape of the images a model takes, as GetModel reports it.
struct ImageShape {
  int64_t height = 28, width = 28, channels = 1;
};

// `model` (empty: the default model of `kind`) from ListModels.
absl::StatusOr<ImageShape> ModelShape(v1::KrauseService::Stub* stub,
                                      const krause::client::ConnectionOptions& conn,
                                      const std::string& model, v1::ModelInfo::Kind kind) {
  grpc::ClientContext ctx;
  krause::client::PrepareContext(conn, &ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListModelsResponse list;
  const grpc::Status st = stub->ListModels(&ctx, v1::ListModelsRequest(), &list);
  if (!st.ok()) return absl::UnavailableError(krause::client::Explain(st, conn));
  for (const v1::ModelInfo& m : list.models()) {
    if (model.empty() ? (m.kind() == kind && m.is_default()) : m.name() == model)
      return ImageShape{m.height(), m.width(), m.channels()};
  }
  return absl::NotFoundError(
      absl::StrCat("the server lists no model ", model.empty() ? "(default)" : model));
}

std::vector<v1::Image> LoadImages(const ImageShape& shape) {
  std::vector<v1::Image> out;
  if (absl::GetFlag(FLAGS_data) == "fashion-mnist") {
    auto ds = krause::ReadIdxArray(
        krause::MnistStyleFile(krause::kFashionMnistDir, /*train=*/false, "images-idx3"));
    if (ds.ok() && (ds->dims.size() != 3 || ds->dims[0] < 1000)) {
      ds = absl::DataLossError("the Fashion-MNIST test images are not 1000 or more N x H x W");
    }
    if (ds.ok()) {
      const int64_t px = ds->dims[1] * ds->dims[2];
      const std::string_view data = ds->data;
      for (int64_t i = 0; i < 1000; ++i) {
        out.push_back(
            krause::server::RawImageProto(ds->dims[1], ds->dims[2], 1, data.substr(i * px, px)));
      }
      return out;
    }
    std::fprintf(stderr, "krause-loadgen: %s; using synthetic images\n",
                 ds.status().ToString().c_str());
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 64; ++i) {
    std::string px(shape.height * shape.width * shape.channels, '\0');
    for (char& c : px) c = static_cast<char>(rng() & 255);
    out.push_back(krause::server::RawImageProto(shape.height, shape.width, shape.channels, px));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  krause::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "load tests krause-server (closed or open loop, classify / generate / mix).\n"
      "  krause-loadgen --workload classify --concurrency 32 --duration 20 --metrics "
      "localhost:9464\n"
      "  krause-loadgen --mode open --rate 100 --arrivals poisson --workload mix --json "
      "report.json");
  absl::ParseCommandLine(argc, argv);
  krause::client::ConnectionOptions conn;
  conn.server = absl::GetFlag(FLAGS_server);
  conn.retry = absl::GetFlag(FLAGS_retry);
  conn.token = absl::GetFlag(FLAGS_token);
  conn.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  const std::string mode = absl::GetFlag(FLAGS_mode), workload = absl::GetFlag(FLAGS_workload);
  if ((mode != "closed" && mode != "open") || !KnownWorkload(workload)) {
    std::fprintf(stderr,
                 "krause-loadgen: --mode closed|open, --workload "
                 "classify|generate|complete|score|getmodel|mix\n");
    return 2;
  }
  const std::string protocol = absl::GetFlag(FLAGS_protocol);
  const bool over_http = protocol == "http" || protocol == "openai";
  if ((protocol != "krause" && protocol != "oip" && !over_http) ||
      (protocol == "oip" && workload != "classify" && workload != "score" &&
       workload != "generate" && workload != "mix") ||
      (protocol == "http" && workload != "classify" && workload != "generate" &&
       workload != "mix") ||
      (protocol == "openai" && workload != "generate")) {
    std::fprintf(stderr,
                 "krause-loadgen: --protocol krause|oip|http|openai (oip: --workload classify, "
                 "score, generate or mix; http: classify, generate or mix; openai: generate)\n");
    return 2;
  }
  if (over_http && (!conn.tls_ca.empty() || absl::GetFlag(FLAGS_resume))) {
    std::fprintf(stderr, "krause-loadgen: --protocol %s speaks plain HTTP, without --resume\n",
                 protocol.c_str());
    return 2;
  }
  std::vector<TenantLoad> tenants;
  const std::string tenants_flag = absl::GetFlag(FLAGS_tenants);
  if (tenants_flag.empty()) {
    tenants.push_back(
        {"", conn.token, std::max(1, absl::GetFlag(FLAGS_concurrency)), LoadOptionsFromFlags()});
  } else {
    if (protocol != "krause" || mode != "closed") {
      std::fprintf(stderr, "krause-loadgen: --tenants runs closed loops over --protocol krause\n");
      return 2;
    }
    auto t = ParseTenants(tenants_flag, LoadOptionsFromFlags());
    if (!t.ok()) {
      std::fprintf(stderr, "krause-loadgen: %s\n", std::string(t.status().message()).c_str());
      return 2;
    }
    tenants = *std::move(t);
  }
  // Each tenant's channels (its token) and stubs.
  std::vector<std::vector<std::unique_ptr<v1::KrauseService::Stub>>> stubs(tenants.size());
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> oip_stubs;
  for (size_t t = 0; t < tenants.size(); ++t) {
    for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_channels)); ++i) {
      // Distinct channel arguments keep gRPC from sharing one connection between the channels.
      krause::client::ConnectionOptions c = conn;
      c.token = tenants[t].token;
      auto ch = krause::client::MakeChannel(c, static_cast<int>(t) * 1000 + i);
      if (!ch.ok()) {
        std::fprintf(stderr, "krause-loadgen: %s\n", ch.status().ToString().c_str());
        return 1;
      }
      stubs[t].push_back(v1::KrauseService::NewStub(*ch));
      if (protocol == "oip") oip_stubs.push_back(inference::GRPCInferenceService::NewStub(*ch));
    }
  }
  const std::string metrics = absl::GetFlag(FLAGS_metrics);
  std::string before;
  if (!metrics.empty()) {
    auto m = krause::client::HttpGet(metrics, "/metrics");
    if (!m.ok()) {
      std::fprintf(stderr, "krause-loadgen: --metrics: %s\n", m.status().ToString().c_str());
      return 1;
    }
    before = *m;
  }

  std::unique_ptr<krause::client::HttpLoadClient> http;
  if (over_http)
    http = std::make_unique<krause::client::HttpLoadClient>(absl::GetFlag(FLAGS_http_server),
                                                            conn.token);
  const std::string data = absl::GetFlag(FLAGS_data);
  if (data != "fashion-mnist" && data != "synthetic") {
    std::fprintf(stderr, "krause-loadgen: --data fashion-mnist|synthetic, got %s\n", data.c_str());
    return 2;
  }
  ImageShape shape;
  if (data == "synthetic" && (workload == "classify" || workload == "mix" || workload == "score")) {
    // Classify's model (Score's: the generator's) decides the images' shape.
    const std::string model = workload == "score" ? absl::GetFlag(FLAGS_generate_model)
                                                  : absl::GetFlag(FLAGS_classify_model);
    krause::client::ConnectionOptions first = conn;
    first.token = tenants[0].token;
    auto s = ModelShape(stubs[0][0].get(), first, model,
                        workload == "score" ? v1::ModelInfo::GENERATOR : v1::ModelInfo::CLASSIFIER);
    if (!s.ok()) {
      std::fprintf(stderr, "krause-loadgen: --data synthetic: %s\n", s.status().ToString().c_str());
      return 1;
    }
    shape = *s;
  }
  const std::vector<v1::Image> images = LoadImages(shape);
  std::vector<std::unique_ptr<krause::loadgen::LoadGen>> gens;
  for (size_t t = 0; t < tenants.size(); ++t) {
    krause::client::ConnectionOptions c = conn;
    c.token = tenants[t].token;
    auto& gen = gens.emplace_back(
        std::make_unique<krause::loadgen::LoadGen>(tenants[t].options, c, images));
    if (protocol == "oip") {
      gen->SetDriver(krause::loadgen::MakeOipDriver(gen.get(), std::move(oip_stubs)));
    } else if (over_http) {
      gen->SetDriver(
          krause::loadgen::MakeHttpDriver(gen.get(), std::move(http), protocol == "openai"));
    } else {
      gen->SetDriver(krause::loadgen::MakeKrauseDriver(gen.get(), std::move(stubs[t])));
    }
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const double warmup = absl::GetFlag(FLAGS_warmup), duration = absl::GetFlag(FLAGS_duration);
  const int64_t want = absl::GetFlag(FLAGS_requests);
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point measure_from =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warmup));
  std::atomic<int64_t> measured_started{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  // Whether a call starting now is measured, and whether it may start at all.
  auto admit = [&](bool* measured) {
    if (stop.load() || g_interrupted.load()) return false;
    const Clock::time_point now = Clock::now();
    *measured = now >= measure_from;
    if (!*measured) return true;
    if (want > 0) return measured_started.fetch_add(1) < want;
    if (Seconds(now - measure_from) >= duration) return false;
    measured_started.fetch_add(1);
    return true;
  };
  std::vector<std::function<void()>> next(tenants.size());
  std::thread pacer;  // open loop: issues the calls at their arrival times
  if (mode == "closed") {
    for (size_t t = 0; t < tenants.size(); ++t) {
      next[t] = [&, t] {
        bool measured;
        if (admit(&measured)) {
          gens[t]->Issue(measured, next[t]);
        } else {
          cv.notify_all();
        }
      };
    }
    for (size_t t = 0; t < tenants.size(); ++t)
      for (int i = 0; i < tenants[t].concurrency; ++i) next[t]();
  } else {
    pacer = std::thread([&] {
      std::mt19937_64 rng(7);
      std::exponential_distribution<double> exp(absl::GetFlag(FLAGS_rate));
      const bool poisson = absl::GetFlag(FLAGS_arrivals) == "poisson";
      Clock::time_point at = Clock::now();
      for (;;) {
        bool measured;
        if (!admit(&measured)) break;
        gens[0]->Issue(measured, [&] { cv.notify_all(); });
        const double gap = poisson ? exp(rng) : 1.0 / absl::GetFlag(FLAGS_rate);
        at += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap));
        // Until the next arrival, or at once when the run stops (the main thread joins us).
        std::unique_lock<std::mutex> l(mu);
        cv.wait_until(l, at, [&] { return stop.load(); });
      }
    });
  }
  // Progress until every admitted call has ended.
  const bool progress = absl::GetFlag(FLAGS_progress);
  Clock::time_point measure_end{};
  for (;;) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait_for(l, std::chrono::milliseconds(500));
    const double el = Seconds(Clock::now() - t0);
    int64_t done = 0, in_flight = 0;
    for (const auto& gen : gens) {
      std::lock_guard<std::mutex> s(gen->stats().mu);
      done += gen->stats().measured_done;
      in_flight += gen->in_flight();
    }
    const bool admitting =
        g_interrupted.load() ? false
        : want > 0           ? measured_started.load() < want
                   : Clock::now() < measure_from + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(duration));
    if (progress) {
      const double total = want > 0 ? static_cast<double>(want) : warmup + duration;
      const double frac = want > 0 ? done / total : std::min(1.0, el / total);
      std::fprintf(
          stderr, "\r%s %5.1f%%  %lld calls done, %lld in flight, %.0fs elapsed, eta %.0fs   ",
          el < warmup ? "warm-up" : "load   ", 100 * frac, static_cast<long long>(done),
          static_cast<long long>(in_flight), el, frac > 0 ? std::max(0.0, el / frac - el) : 0.0);
    }
    if (!admitting && measure_end == Clock::time_point{}) {
      measure_end = Clock::now();
      stop.store(true);
      cv.notify_all();  // wakes the pacer
    }
    if (stop.load() && in_flight == 0) break;
  }
  if (pacer.joinable()) pacer.join();
  if (progress) std::fprintf(stderr, "\n");
  // From the end of the warm-up to the end of the last measured call (not to when this thread
  // noticed it: its wait above may add up to 500 ms, a large share of a short run).
  Clock::time_point measured_end{};
  for (const auto& gen : gens) {
    std::lock_guard<std::mutex> l(gen->stats().mu);
    if (gen->stats().last_done > measure_from)
      measured_end = std::max(measured_end, gen->stats().last_done);
  }
  if (measured_end == Clock::time_point{}) measured_end = Clock::now();
  const double measured_seconds = Seconds(measured_end - measure_from);

  krause::loadgen::ReportInput in;
  in.config = {{"server", over_http ? absl::GetFlag(FLAGS_http_server) : conn.server},
               {"protocol", protocol},
               {"mode", mode},
               {"workload", workload},
               {"concurrency", absl::GetFlag(FLAGS_concurrency)},
               {"rate", absl::GetFlag(FLAGS_rate)},
               {"arrivals", absl::GetFlag(FLAGS_arrivals)},
               {"channels", absl::GetFlag(FLAGS_channels)},
               {"images_per_request", absl::GetFlag(FLAGS_images_per_request)},
               {"generate_images", absl::GetFlag(FLAGS_generate_images)},
               {"classify_model", absl::GetFlag(FLAGS_classify_model)},
               {"generate_model", absl::GetFlag(FLAGS_generate_model)},
               {"warmup_seconds", warmup}};
  in.mode = mode;
  in.workload = workload;
  in.start = t0;
  in.measured_seconds = measured_seconds;
  in.resume = absl::GetFlag(FLAGS_resume);
  in.metrics = metrics;
  in.metrics_before = before;
  in.json_path = absl::GetFlag(FLAGS_json);
  if (tenants_flag.empty()) return krause::loadgen::Report(in, gens[0]->stats());
  in.config["tenants"] = tenants_flag;
  std::vector<krause::loadgen::TenantRun> runs;
  for (size_t t = 0; t < tenants.size(); ++t)
    runs.push_back({tenants[t].name, tenants[t].options.workload, &gens[t]->stats()});
  return krause::loadgen::ReportTenants(in, runs);
}
