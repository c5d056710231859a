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
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "client/connection.h"
#include "client/http_get.h"
#include "client/http_load.h"
#include "client/resume.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "krause/v1/krause.grpc.pb.h"
#include "model/data/idx.h"
#include "model/util/help.h"
#include "server/edge/status.h"
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
          "krause (krause.v1), oip (the Open Inference Protocol's ModelInfer over gRPC) or http "
          "(REST infer and generate_stream on --http_server; plain HTTP)");
ABSL_FLAG(std::string, http_server, "localhost:8000", "--protocol http: the REST port, host:port");
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

namespace {

namespace v1 = krause::v1;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// SIGINT / SIGTERM: stop starting calls, let those in flight end, report what was measured.
std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted.store(true); }

struct Stats {
  std::mutex mu;
  std::map<std::string, std::vector<double>> latency;  // rpc -> seconds (OK calls)
  std::vector<double> first_chunk, first_pixel, chunk_gap;
  std::map<std::string, std::map<std::string, int64_t>> codes;  // rpc -> code -> calls
  int64_t images = 0;
  int64_t measured_done = 0;
  // --resume: breaks survived, calls made to continue them, rows sampled again.
  int64_t resumed_streams = 0, resume_calls = 0, rows_recomputed = 0;
  Clock::time_point last_done{};           // when the last measured call ended
  std::vector<std::string> error_samples;  // --protocol http: the first distinct errors
};

json Percentiles(std::vector<double> v) {
  if (v.empty()) return json::object();
  std::sort(v.begin(), v.end());
  auto q = [&](double p) {
    const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
    return v[i];
  };
  double sum = 0;
  for (double x : v) sum += x;
  return {{"count", v.size()}, {"mean", sum / v.size()}, {"p50", q(0.50)}, {"p90", q(0.90)},
          {"p95", q(0.95)},    {"p99", q(0.99)},         {"max", v.back()}};
}

class LoadGen {
 public:
  LoadGen(std::vector<std::unique_ptr<v1::KrauseService::Stub>> stubs,
          std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> oip_stubs,
          std::unique_ptr<krause::client::HttpLoadClient> http,
          krause::client::ConnectionOptions conn, std::vector<v1::Image> images)
      : stubs_(std::move(stubs)),
        oip_stubs_(std::move(oip_stubs)),
        http_(std::move(http)),
        conn_(std::move(conn)),
        images_(std::move(images)) {}

  // Starts one call; `done` runs when it ends (on a gRPC thread).
  void Issue(bool measured, std::function<void()> done) {
    in_flight_.fetch_add(1);
    const uint64_t n = counter_.fetch_add(1);
    auto& stub = *stubs_[n % stubs_.size()];
    const std::string w = absl::GetFlag(FLAGS_workload);
    bool classify = w == "classify";
    if (w == "mix") {
      std::lock_guard<std::mutex> l(rng_mu_);
      classify =
          std::uniform_real_distribution<double>(0, 1)(rng_) < absl::GetFlag(FLAGS_mix_classify);
    }
    const int k = std::max(1, absl::GetFlag(FLAGS_images_per_request));
    if (!oip_stubs_.empty()) {
      const char* what = w == "score" ? "score" : classify ? "classify" : "generate";
      IssueOip(*oip_stubs_[n % oip_stubs_.size()], n, what, k, measured, std::move(done));
      return;
    }
    if (http_) {
      IssueHttp(n, classify, k, measured, std::move(done));
      return;
    }
    if (w == "getmodel") {  // the RPC floor: a call that runs no model
      v1::GetModelRequest req;
      req.set_name(model_name_);
      Unary<v1::ModelInfo>("GetModel", std::move(req), 0, measured, std::move(done),
                           [&stub](auto&&... a) { stub.async()->GetModel(a...); });
      return;
    }
    if (w == "score") {
      v1::ScoreRequest req;
      req.set_model(absl::GetFlag(FLAGS_generate_model));
      for (int i = 0; i < k; ++i) *req.add_images() = images_[(n * k + i) % images_.size()];
      Unary<v1::ScoreResponse>("Score", std::move(req), k, measured, std::move(done),
                               [&stub](auto&&... a) { stub.async()->Score(a...); });
      return;
    }
    if (classify) {
      v1::ClassifyRequest req;
      req.set_model(absl::GetFlag(FLAGS_classify_model));
      req.set_top_k(1);
      for (int i = 0; i < k; ++i) *req.add_images() = images_[(n * k + i) % images_.size()];
      Unary<v1::ClassifyResponse>("Classify", std::move(req), k, measured, std::move(done),
                                  [&stub](auto&&... a) { stub.async()->Classify(a...); });
    } else {
      const v1::Image* prompt = w == "complete" ? &images_[n % images_.size()] : nullptr;
      if (absl::GetFlag(FLAGS_resume)) {
        ResumedGenerate(stub, n, measured, prompt, std::move(done));
      } else {
        new GenerateCall(this, stub, n, measured, prompt, std::move(done));
      }
    }
  }

  // The workload's call as the Open Inference Protocol's ModelInfer: images as one raw UINT8
  // [k, H, W, C] input, generation as parameters (num_images, a seed per call).
  void IssueOip(inference::GRPCInferenceService::Stub& stub, uint64_t n, const std::string& what,
                int k, bool measured, std::function<void()> done) {
    inference::ModelInferRequest req;
    int64_t images = k;
    if (what == "generate") {
      const std::string m = absl::GetFlag(FLAGS_generate_model);
      req.set_model_name(m.empty() ? "karm-fmnist" : m);
      images = std::max(1, absl::GetFlag(FLAGS_generate_images));
      (*req.mutable_parameters())["num_images"].set_int64_param(images);
      (*req.mutable_parameters())["seed"].set_uint64_param(n);
    } else {
      const std::string m = what == "score" ? absl::GetFlag(FLAGS_generate_model) : model_name_;
      req.set_model_name(m.empty() ? "karm-fmnist" : m);
      const v1::RawImage& first = images_[(n * k) % images_.size()].raw();
      auto* in = req.add_inputs();
      in->set_name("image");
      in->set_datatype("UINT8");
      for (int64_t d :
           {int64_t{k}, int64_t{first.height()}, int64_t{first.width()}, int64_t{first.channels()}})
        in->add_shape(d);
      std::string* raw = req.add_raw_input_contents();
      for (int i = 0; i < k; ++i) *raw += images_[(n * k + i) % images_.size()].raw().pixels();
    }
    Unary<inference::ModelInferResponse>("ModelInfer", std::move(req), images, measured,
                                         std::move(done),
                                         [&stub](auto&&... a) { stub.async()->ModelInfer(a...); });
  }

  // The workload's call over HTTP: classify as the REST infer (the images as one UINT8 JSON
  // tensor), generate as generate_stream (the same seeds as krause.v1's calls).
  void IssueHttp(uint64_t n, bool classify, int k, bool measured, std::function<void()> done) {
    std::string path, body;
    int64_t images = k;
    int64_t json_length = -1;
    if (classify) {
      path = "/v2/models/" + model_name_ + "/infer";
      const v1::RawImage& first = images_[(n * k) % images_.size()].raw();
      const std::string head =
          absl::StrCat(R"({"inputs":[{"name":"image","datatype":"UINT8",)", R"("shape":[)", k, ",",
                       first.height(), ",", first.width(), ",", first.channels(), "]");
      if (absl::GetFlag(FLAGS_http_binary)) {  // the JSON, then the pixels as they are
        std::string pixels;
        for (int i = 0; i < k; ++i) pixels += images_[(n * k + i) % images_.size()].raw().pixels();
        body = absl::StrCat(head, R"(,"parameters":{"binary_data_size":)", pixels.size(),
                            R"(}}],"parameters":{"binary_data_output":true}})");
        json_length = static_cast<int64_t>(body.size());
        body += pixels;
      } else {
        body = absl::StrCat(head, R"(,"data":[)");
        for (int i = 0; i < k; ++i) {
          for (unsigned char px : images_[(n * k + i) % images_.size()].raw().pixels()) {
            absl::StrAppend(&body, static_cast<int>(px), ",");
          }
        }
        body.back() = ']';
        body += "}]}";
      }
    } else {
      const std::string m = absl::GetFlag(FLAGS_generate_model);
      path = "/v2/models/" + (m.empty() ? std::string("karm-fmnist") : m) + "/generate_stream";
      const v1::GenerateRequest req = GenerateRequest(n, nullptr);
      images = req.num_images();
      body = json{{"num_images", req.num_images()},
                  {"seed", req.seed()},
                  {"update_interval_ms", req.update_interval_ms()}}
                 .dump();
    }
    const char* rpc = classify ? "ModelInfer" : "Generate";
    http_->Post(
        path, std::move(body),
        [this, rpc, classify, images, measured,
         done = std::move(done)](krause::client::HttpCallResult r) {
          Record(rpc, measured, r.code, r.seconds, r.code == "OK" ? images : 0);
          if (measured && r.code == "OK" && !classify) {
            std::lock_guard<std::mutex> l(stats_.mu);
            if (r.first_event >= 0) stats_.first_chunk.push_back(r.first_event);
            if (r.first_pixel >= 0) stats_.first_pixel.push_back(r.first_pixel);
            stats_.chunk_gap.insert(stats_.chunk_gap.end(), r.gaps.begin(), r.gaps.end());
          }
          if (measured && r.code != "OK") NoteError(r.error);
          done();  // before the count drops (see Unary)
          in_flight_.fetch_sub(1);
        },
        json_length);
  }

  // The first few distinct errors, for the report (what an HTTP status alone does not say).
  void NoteError(const std::string& what) {
    std::lock_guard<std::mutex> l(stats_.mu);
    if (stats_.error_samples.size() < 5 &&
        std::find(stats_.error_samples.begin(), stats_.error_samples.end(), what) ==
            stats_.error_samples.end())
      stats_.error_samples.push_back(what);
  }

  // One asynchronous unary call of `req`, started by `start(ctx, req, resp, callback)` (the
  // stub's async method); when it ends it is recorded under `rpc`, with `images` counted if OK.
  template <typename Resp, typename Req, typename Start>
  void Unary(const char* rpc, Req req, int64_t images, bool measured, std::function<void()> done,
             Start start) {
    struct Call {
      grpc::ClientContext ctx;
      Req req;
      Resp resp;
      Clock::time_point start;
    };
    auto* c = new Call;
    krause::client::PrepareContext(conn_, &c->ctx);
    c->req = std::move(req);
    c->start = Clock::now();
    start(&c->ctx, &c->req, &c->resp,
          std::function<void(grpc::Status)>(
              [this, c, rpc, images, measured, done = std::move(done)](grpc::Status st) {
                Record(rpc, measured, st, Seconds(Clock::now() - c->start), st.ok() ? images : 0);
                delete c;
                // `done` first: once in_flight_ reads 0 the main thread may return and destroy
                // what `done` refers to.
                done();
                in_flight_.fetch_sub(1);
              }));
  }

  void Record(const char* rpc, bool measured, const grpc::Status& st, double seconds,
              int64_t images) {
    Record(rpc, measured, krause::server::GrpcCodeName(st.error_code()), seconds, images);
  }
  void Record(const char* rpc, bool measured, const std::string& code, double seconds,
              int64_t images) {
    if (!measured) return;
    std::lock_guard<std::mutex> l(stats_.mu);
    stats_.codes[rpc][code] += 1;
    if (code == "OK") {
      stats_.latency[rpc].push_back(seconds);
      stats_.images += images;
    }
    ++stats_.measured_done;
    stats_.last_done = Clock::now();
  }

  // --resume: the call through client::ResumingGenerate, read on a thread of its own.
  void ResumedGenerate(v1::KrauseService::Stub& stub, uint64_t n, bool measured,
                       const v1::Image* prompt, std::function<void()> done) {
    std::thread([this, &stub, n, measured, req = GenerateRequest(n, prompt),
                 done = std::move(done)] {
      krause::client::ResumeOptions ro;
      ro.deadline_seconds = conn_.timeout_seconds;
      const Clock::time_point start = Clock::now();
      krause::client::ResumingGenerate call(&stub, conn_, req, ro);
      v1::GenerateResponse m;
      double first = -1, first_pixel = -1;
      while (call.Read(&m)) {
        if (first < 0) first = Seconds(Clock::now() - start);
        if (first_pixel < 0 && m.progress().pixels_done() > 0)
          first_pixel = Seconds(Clock::now() - start);
      }
      const grpc::Status st = call.Finish();
      const krause::client::ResumeStats rs = call.stats();
      Record("Generate", measured, st, Seconds(Clock::now() - start),
             st.ok() ? req.num_images() : 0);
      if (measured) {
        std::lock_guard<std::mutex> l(stats_.mu);
        stats_.resumed_streams += static_cast<int64_t>(rs.breaks.size());
        stats_.resume_calls += rs.resumed_calls;
        stats_.rows_recomputed += rs.rows_recomputed;
        if (st.ok() && first >= 0) stats_.first_chunk.push_back(first);
        if (st.ok() && first_pixel >= 0) stats_.first_pixel.push_back(first_pixel);
      }
      done();  // before the count drops (see Unary)
      in_flight_.fetch_sub(1);
    }).detach();
  }

  static v1::GenerateRequest GenerateRequest(uint64_t n, const v1::Image* prompt) {
    v1::GenerateRequest req;
    req.set_model(absl::GetFlag(FLAGS_generate_model));
    req.set_num_images(static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_generate_images))));
    req.set_seed(n * 1000);
    req.set_update_interval_ms(static_cast<uint32_t>(absl::GetFlag(FLAGS_update_interval_ms)));
    if (prompt != nullptr) {
      *req.mutable_prompt() = *prompt;
      req.set_prompt_rows(static_cast<uint32_t>(absl::GetFlag(FLAGS_prompt_rows)));
    }
    return req;
  }

  Stats& stats() { return stats_; }
  int64_t in_flight() const { return in_flight_.load(); }

 private:
  class GenerateCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    GenerateCall(LoadGen* g, v1::KrauseService::Stub& stub, uint64_t n, bool measured,
                 const v1::Image* prompt, std::function<void()> done)
        : g_(g), measured_(measured), done_(std::move(done)) {
      krause::client::PrepareContext(g->conn_, &ctx_);
      req_ = GenerateRequest(n, prompt);
      start_ = last_ = Clock::now();
      stub.async()->Generate(&ctx_, &req_, this);
      StartRead(&msg_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      const Clock::time_point now = Clock::now();
      if (chunks_++ == 0) first_ = Seconds(now - start_);
      // Gaps between the chunks of a running stream: from the first message with pixels on
      // (before it, the images wait for a cache slot; that wait is the first pixel's time).
      const bool has_pixels = msg_.progress().pixels_done() > 0 || msg_.images_size() > 0;
      if (running_) {
        gaps_.push_back(Seconds(now - last_));
      } else if (has_pixels) {
        running_ = true;
        first_pixel_ = Seconds(now - start_);
      }
      last_ = now;
      StartRead(&msg_);
    }
    void OnDone(const grpc::Status& st) override {
      g_->Record("Generate", measured_, st, Seconds(Clock::now() - start_),
                 st.ok() ? req_.num_images() : 0);
      if (measured_ && st.ok()) {
        std::lock_guard<std::mutex> l(g_->stats_.mu);
        if (chunks_ > 0) g_->stats_.first_chunk.push_back(first_);
        if (running_) g_->stats_.first_pixel.push_back(first_pixel_);
        g_->stats_.chunk_gap.insert(g_->stats_.chunk_gap.end(), gaps_.begin(), gaps_.end());
      }
      LoadGen* g = g_;
      auto done = std::move(done_);
      delete this;
      done();  // before the count drops (see Unary)
      g->in_flight_.fetch_sub(1);
    }

   private:
    LoadGen* g_;
    bool measured_;
    std::function<void()> done_;
    grpc::ClientContext ctx_;
    v1::GenerateRequest req_;
    v1::GenerateResponse msg_;
    Clock::time_point start_, last_;
    double first_ = 0, first_pixel_ = 0;
    int chunks_ = 0;
    bool running_ = false;
    std::vector<double> gaps_;
  };

  std::vector<std::unique_ptr<v1::KrauseService::Stub>> stubs_;
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> oip_stubs_;  // --protocol oip
  std::unique_ptr<krause::client::HttpLoadClient> http_;  // --protocol http
  krause::client::ConnectionOptions conn_;
  std::vector<v1::Image> images_;
  std::string model_name_ = absl::GetFlag(FLAGS_classify_model).empty()
                                ? "krause-vit-fmnist"
                                : absl::GetFlag(FLAGS_classify_model);
  std::atomic<uint64_t> counter_{0};
  std::atomic<int64_t> in_flight_{0};
  std::mutex rng_mu_;
  std::mt19937_64 rng_{12345};
  Stats stats_;
};

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

// The server's view from two scrapes: FLOPs and batch sizes over the run.
json ServerView(const std::string& before, const std::string& after) {
  using krause::client::PrometheusSum;
  auto delta = [&](const std::string& name, const std::map<std::string, std::string>& l = {}) {
    return PrometheusSum(after, name, l) - PrometheusSum(before, name, l);
  };
  json j;
  const double ex = delta("krause_flops_executed_total"),
               de = delta("krause_flops_dense_equivalent_total");
  j["flops_executed"] = ex;
  j["flops_dense_equivalent"] = de;
  j["flop_saving"] = de > 0 ? 1 - ex / de : 0.0;
  const double cb = delta("krause_classify_batch_images_count");
  j["classify_batches"] = cb;
  j["classify_mean_batch_images"] = cb > 0 ? delta("krause_classify_batch_images_sum") / cb : 0.0;
  const double ds = delta("krause_decode_batch_sequences_count");
  j["decode_steps"] = ds;
  j["decode_mean_batch_sequences"] = ds > 0 ? delta("krause_decode_batch_sequences_sum") / ds : 0.0;
  j["generated_pixels"] = delta("krause_generated_pixels_total");
  // Where a Classify call's time went inside the server (means over the run): the whole call,
  // waiting for its batch, and the batch's forward.
  auto mean = [&](const std::string& name, const std::map<std::string, std::string>& l) {
    const double n = delta(name + "_count", l);
    return n > 0 ? delta(name + "_sum", l) / n : 0.0;
  };
  j["classify_call_mean_seconds"] = mean("krause_request_duration_seconds", {{"rpc", "Classify"}});
  j["classify_queue_mean_seconds"] = mean("krause_queue_duration_seconds", {{"rpc", "Classify"}});
  j["classify_batch_compute_mean_seconds"] =
      mean("krause_compute_duration_seconds", {{"work", "classify_batch"}});
  return j;
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
  if ((mode != "closed" && mode != "open") ||
      (workload != "classify" && workload != "generate" && workload != "complete" &&
       workload != "score" && workload != "getmodel" && workload != "mix")) {
    std::fprintf(stderr,
                 "krause-loadgen: --mode closed|open, --workload "
                 "classify|generate|complete|score|getmodel|mix\n");
    return 2;
  }
  const std::string protocol = absl::GetFlag(FLAGS_protocol);
  if ((protocol != "krause" && protocol != "oip" && protocol != "http") ||
      (protocol == "oip" && workload != "classify" && workload != "score" &&
       workload != "generate" && workload != "mix") ||
      (protocol == "http" && workload != "classify" && workload != "generate" &&
       workload != "mix")) {
    std::fprintf(stderr,
                 "krause-loadgen: --protocol krause|oip|http (oip: --workload classify, score, "
                 "generate or mix; http: classify, generate or mix)\n");
    return 2;
  }
  if (protocol == "http" && (!conn.tls_ca.empty() || absl::GetFlag(FLAGS_resume))) {
    std::fprintf(stderr, "krause-loadgen: --protocol http speaks plain HTTP, without --resume\n");
    return 2;
  }
  std::vector<std::unique_ptr<v1::KrauseService::Stub>> stubs;
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> oip_stubs;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_channels)); ++i) {
    // Distinct channel arguments keep gRPC from sharing one connection between the channels.
    krause::client::ConnectionOptions c = conn;
    auto ch = krause::client::MakeChannel(c, i);
    if (!ch.ok()) {
      std::fprintf(stderr, "krause-loadgen: %s\n", ch.status().ToString().c_str());
      return 1;
    }
    stubs.push_back(v1::KrauseService::NewStub(*ch));
    if (protocol == "oip") oip_stubs.push_back(inference::GRPCInferenceService::NewStub(*ch));
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
  if (protocol == "http")
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
    auto s = ModelShape(stubs[0].get(), conn, model,
                        workload == "score" ? v1::ModelInfo::GENERATOR : v1::ModelInfo::CLASSIFIER);
    if (!s.ok()) {
      std::fprintf(stderr, "krause-loadgen: --data synthetic: %s\n", s.status().ToString().c_str());
      return 1;
    }
    shape = *s;
  }
  LoadGen gen(std::move(stubs), std::move(oip_stubs), std::move(http), conn, LoadImages(shape));
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
  std::function<void()> next;
  std::thread pacer;  // open loop: issues the calls at their arrival times
  if (mode == "closed") {
    next = [&] {
      bool measured;
      if (admit(&measured)) {
        gen.Issue(measured, next);
      } else {
        cv.notify_all();
      }
    };
    for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_concurrency)); ++i) next();
  } else {
    pacer = std::thread([&] {
      std::mt19937_64 rng(7);
      std::exponential_distribution<double> exp(absl::GetFlag(FLAGS_rate));
      const bool poisson = absl::GetFlag(FLAGS_arrivals) == "poisson";
      Clock::time_point at = Clock::now();
      for (;;) {
        bool measured;
        if (!admit(&measured)) break;
        gen.Issue(measured, [&] { cv.notify_all(); });
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
    int64_t done;
    {
      std::lock_guard<std::mutex> s(gen.stats().mu);
      done = gen.stats().measured_done;
    }
    const bool admitting =
        g_interrupted.load() ? false
        : want > 0           ? measured_started.load() < want
                   : Clock::now() < measure_from + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(duration));
    if (progress) {
      const double total = want > 0 ? static_cast<double>(want) : warmup + duration;
      const double frac = want > 0 ? done / total : std::min(1.0, el / total);
      std::fprintf(stderr,
                   "\r%s %5.1f%%  %lld calls done, %lld in flight, %.0fs elapsed, eta %.0fs   ",
                   el < warmup ? "warm-up" : "load   ", 100 * frac, static_cast<long long>(done),
                   static_cast<long long>(gen.in_flight()), el,
                   frac > 0 ? std::max(0.0, el / frac - el) : 0.0);
    }
    if (!admitting && measure_end == Clock::time_point{}) {
      measure_end = Clock::now();
      stop.store(true);
      cv.notify_all();  // wakes the pacer
    }
    if (stop.load() && gen.in_flight() == 0) break;
  }
  if (pacer.joinable()) pacer.join();
  if (progress) std::fprintf(stderr, "\n");
  // From the end of the warm-up to the end of the last measured call (not to when this thread
  // noticed it: its wait above may add up to 500 ms, a large share of a short run).
  Clock::time_point measured_end = Clock::now();
  {
    std::lock_guard<std::mutex> l(gen.stats().mu);
    if (gen.stats().last_done > measure_from) measured_end = gen.stats().last_done;
  }
  const double measured_seconds = Seconds(measured_end - measure_from);

  json report;
  report["config"] = {
      {"server", protocol == "http" ? absl::GetFlag(FLAGS_http_server) : conn.server},
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
  Stats& s = gen.stats();
  int64_t calls = 0;
  for (auto& [rpc, codes] : s.codes) {
    for (auto& [code, n] : codes) calls += n;
    report["errors_by_code"][rpc] = codes;
    report["latency_seconds"][rpc] = Percentiles(s.latency[rpc]);
  }
  report["measured_seconds"] = measured_seconds;
  // The load generator's own CPU time over the whole run (it shares the cores with the server).
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                     1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  report["cpu_seconds"] = cpu;
  report["wall_seconds"] = Seconds(Clock::now() - t0);
  report["calls"] = calls;
  report["calls_per_second"] = calls / measured_seconds;
  report["images_per_second"] = s.images / measured_seconds;
  report["generate_first_chunk_seconds"] = Percentiles(s.first_chunk);
  report["generate_first_pixel_seconds"] = Percentiles(s.first_pixel);
  report["generate_chunk_gap_seconds"] = Percentiles(s.chunk_gap);
  if (!s.error_samples.empty()) report["error_samples"] = s.error_samples;
  if (absl::GetFlag(FLAGS_resume)) {
    report["resumed_streams"] = s.resumed_streams;
    report["resume_calls"] = s.resume_calls;
    report["rows_recomputed"] = s.rows_recomputed;
  }
  if (!metrics.empty()) {
    auto after = krause::client::HttpGet(metrics, "/metrics");
    if (after.ok()) report["server"] = ServerView(before, *after);
  }

  std::printf("%s loop, %s, %.1f s measured: %lld calls, %.2f calls/s, %.2f images/s\n",
              mode.c_str(), workload.c_str(), measured_seconds, static_cast<long long>(calls),
              calls / measured_seconds, s.images / measured_seconds);
  std::printf("  load generator CPU: %.2f s over %.2f s of wall time\n", cpu,
              report["wall_seconds"].get<double>());
  for (auto& [rpc, p] : report["latency_seconds"].items()) {
    if (p.empty()) continue;
    std::printf("  %-9s latency ms: p50 %.1f  p90 %.1f  p95 %.1f  p99 %.1f  max %.1f\n",
                rpc.c_str(), 1e3 * p["p50"].get<double>(), 1e3 * p["p90"].get<double>(),
                1e3 * p["p95"].get<double>(), 1e3 * p["p99"].get<double>(),
                1e3 * p["max"].get<double>());
  }
  if (!s.first_chunk.empty()) {
    const json& f = report["generate_first_chunk_seconds"];
    const json& g = report["generate_chunk_gap_seconds"];
    const json& fp = report["generate_first_pixel_seconds"];
    std::printf(
        "  Generate  first chunk ms: p50 %.1f p99 %.1f; first pixels ms: p50 %.1f p99 %.1f; "
        "gaps of running streams ms: p50 %.1f p99 %.1f\n",
        1e3 * f["p50"].get<double>(), 1e3 * f["p99"].get<double>(),
        fp.empty() ? 0.0 : 1e3 * fp["p50"].get<double>(),
        fp.empty() ? 0.0 : 1e3 * fp["p99"].get<double>(),
        g.empty() ? 0.0 : 1e3 * g["p50"].get<double>(),
        g.empty() ? 0.0 : 1e3 * g["p99"].get<double>());
  }
  for (auto& [rpc, codes] : s.codes)
    for (auto& [code, n] : codes)
      std::printf("  %s %s: %lld\n", rpc.c_str(), code.c_str(), static_cast<long long>(n));
  for (const std::string& e : s.error_samples) std::printf("  error: %s\n", e.c_str());
  if (absl::GetFlag(FLAGS_resume))
    std::printf("  Generate  resumed streams: %lld (on %lld calls), rows recomputed: %lld\n",
                static_cast<long long>(s.resumed_streams), static_cast<long long>(s.resume_calls),
                static_cast<long long>(s.rows_recomputed));
  if (report.contains("server")) {
    const json& v = report["server"];
    std::printf(
        "  server: FLOP saving %.1f%%, mean classify batch %.2f images, mean decode batch %.2f "
        "sequences\n",
        100 * v["flop_saving"].get<double>(), v["classify_mean_batch_images"].get<double>(),
        v["decode_mean_batch_sequences"].get<double>());
  }
  const std::string out = absl::GetFlag(FLAGS_json);
  if (out == "-") {
    std::cout << report.dump(2) << "\n";
  } else if (!out.empty()) {
    std::ofstream(out) << report.dump(2) << "\n";
  }
  int64_t failures = 0;
  for (auto& [rpc, codes] : s.codes)
    for (auto& [code, n] : codes)
      if (code != "OK") failures += n;
  return failures > 0 ? 3 : 0;
}
