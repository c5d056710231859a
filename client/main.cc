// krause-client: the command-line client of krause-server.
//
//   krause-client list
//   krause-client health [--service krause.v1.KrauseService]
//   krause-client classify FILE... [--index 0:100] [--top 3]
//   krause-client generate [--num 4] [--seed 1] [--label Sneaker [--guidance 2]] [--out DIR]
//   krause-client complete PROMPT.png --rows 14 [--num 4] [--label Sneaker] [--out DIR]
//   krause-client score FILE... [--index 0:100] [--label NAME | --labels_file IDX]
//   krause-client models index [--ready] | models load NAME | models unload NAME
//                                                         [--model_version V]
//
// FILE: a PNG, or an IDX image file (MNIST / Fashion-MNIST, gzip or raw) with --index A:B.
// classify and score split the images into calls the model accepts (at most its
// max_images_per_request, and --batch).
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/connection.h"
#include "client/inspect.h"
#include "client/models.h"
#include "client/resume.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "krause/v1/krause.grpc.pb.h"
#include "model/data/idx.h"
#include "model/util/files.h"
#include "model/util/help.h"
#include "server/v1/raw_image.h"

ABSL_FLAG(std::string, server, "localhost:50051",
          "server: host:port or any gRPC target (dns:///name:port, ipv4:a:p,b:p: calls are "
          "spread round-robin over its addresses)");
ABSL_FLAG(bool, retry, true,
          "retry UNAVAILABLE (a replica draining or full) up to 4 attempts with backoff: list, "
          "classify, score, and generate before its first message");
ABSL_FLAG(std::string, model, "", "model name (empty: the server's default of the right kind)");
ABSL_FLAG(std::string, model_version, "",
          "the model's version (empty: the newest served); models load/unload: the version to "
          "load or unload (empty: the version policy's / every version)");
ABSL_FLAG(bool, ready, false, "models index: only the versions that serve now");
ABSL_FLAG(bool, json, false, "print the result as JSON");
ABSL_FLAG(double, timeout, 0, "deadline per call in seconds (0: none)");
ABSL_FLAG(bool, tls, false, "connect with TLS (system roots unless --tls_ca)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots to verify the server with (implies --tls)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (implies --tls)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "", "name to check the server certificate against");
ABSL_FLAG(std::string, token, "", "bearer token");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20, "largest message sent or received");
ABSL_FLAG(std::string, service, "", "health: the service to ask about (empty: the whole server)");
ABSL_FLAG(std::string, index, "", "IDX files: the images A:B (A inclusive, B exclusive) or A");
ABSL_FLAG(int32_t, top, 3, "classify: top classes to show per image");
ABSL_FLAG(int32_t, batch, 64,
          "classify/score: images per request at most (also at most the model's "
          "max_images_per_request)");
ABSL_FLAG(std::string, label, "",
          "generate/complete/score: the class (a label of a conditional generator) to draw, or "
          "to score every image with");
ABSL_FLAG(int32_t, class_index, -1,
          "generate/complete/score: the class by index (-1: none; instead of --label)");
ABSL_FLAG(std::string, labels_file, "",
          "score: an IDX label file (e.g. t10k-labels-idx1-ubyte.gz) giving each image's class, "
          "sliced with --index like the images");
ABSL_FLAG(double, guidance, -1,
          "generate/complete: classifier-free guidance scale with --label/--class_index (-1: "
          "the model's default, ModelInfo.default_guidance; 1: off; above 1 the images follow "
          "the class more closely, at twice the compute)");
ABSL_FLAG(int32_t, num, 1, "generate/complete: images to sample");
ABSL_FLAG(int64_t, seed, -1,
          "generate/complete: the call's seed (image i draws from its own stream of (seed, i); -1: "
          "random)");
ABSL_FLAG(double, temperature, -1,
          "generate/complete: temperature (0: greedy; -1: the model's default, else 1)");
ABSL_FLAG(double, top_p, -1,
          "generate/complete: nucleus mass in (0, 1] (-1: the model's default, else 1: off)");
ABSL_FLAG(int32_t, top_k, 0,
          "generate/complete: keep the k most likely values (0: the model's default, else off); "
          "inspect: keys listed per query of a softmax model (0: the model's k)");
ABSL_FLAG(int32_t, rows, 0, "complete: prompt rows to keep");
ABSL_FLAG(std::string, out, ".", "generate/complete/inspect: folder for the PNG files");
ABSL_FLAG(std::string, prefix, "sample", "generate/complete: file names PREFIX-I.png");
ABSL_FLAG(std::string, layer, "", "inspect: layers, e.g. 0,2 (empty: every layer)");
ABSL_FLAG(std::string, head, "", "inspect: heads drawn, e.g. 1 (empty: every head)");
ABSL_FLAG(std::string, query, "",
          "inspect: token indices, e.g. 0,12 (classifiers: 0 = CLS, 1.. = patches; generators: "
          "input positions); empty: the centre token");
ABSL_FLAG(bool, summary, false,
          "inspect: print the per-layer, per-head figures (sink share, mean distance, effective "
          "neighbours) instead of heatmaps");
ABSL_FLAG(bool, progress, true, "generate/complete: live progress bar on stderr");
ABSL_FLAG(bool, resume, true,
          "generate/complete: when the stream breaks (the replica died, drained, or an attempt "
          "passed --attempt_timeout), ask the unfinished images again as completions from the "
          "rows received, on the next address; the images are the same byte for byte");
ABSL_FLAG(int32_t, max_resumes, 8, "generate/complete: breaks survived per call");
ABSL_FLAG(double, attempt_timeout, 0,
          "generate/complete: deadline of one attempt in seconds, after which it is resumed "
          "elsewhere (0: none; --timeout bounds the whole call)");

namespace {

using krause::client::ConnectionOptions;
using nlohmann::json;
namespace v1 = krause::v1;

int Fail(const std::string& what) {
  std::fprintf(stderr, "krause-client: %s\n", what.c_str());
  return 1;
}

int FailRpc(const char* rpc, const grpc::Status& st, const ConnectionOptions& o) {
  return Fail(absl::StrCat(rpc, " failed: ", krause::client::Explain(st, o)));
}

// Images from the command line: PNG files, or IDX files sliced with --index.
struct InputImage {
  std::string name;
  v1::Image image;
};

// --index A:B (or A) of an IDX file of `size` entries: [A, B); the whole file without --index.
absl::StatusOr<std::pair<int64_t, int64_t>> IndexRange(int64_t size) {
  int64_t a = 0, b = size;
  const std::string range = absl::GetFlag(FLAGS_index);
  if (range.empty()) return std::make_pair(a, b);
  std::vector<std::string> parts = absl::StrSplit(range, ':');
  bool ok = parts.size() <= 2 && absl::SimpleAtoi(parts[0], &a);
  if (ok) b = a + 1;
  if (ok && parts.size() == 2) ok = absl::SimpleAtoi(parts[1], &b);
  if (!ok || a < 0 || b > size || a >= b)
    return absl::InvalidArgumentError(
        absl::StrCat("--index ", range, ": need A:B with 0 <= A < B <= ", size));
  return std::make_pair(a, b);
}

absl::StatusOr<std::vector<InputImage>> ReadInputs(const std::vector<std::string>& files) {
  std::vector<InputImage> out;
  for (const std::string& f : files) {
    const std::string ext = std::filesystem::path(f).extension().string();
    if (ext == ".png" || ext == ".PNG") {
      auto bytes = krause::ReadFileToString(f);
      if (!bytes.ok()) return bytes.status();
      InputImage in;
      in.name = f;
      in.image.set_png(std::move(*bytes));
      out.push_back(std::move(in));
      continue;
    }
    auto t = krause::ReadIdxArray(f);
    if (!t.ok()) return t.status();
    if (t->dims.size() != 3)
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": not an IDX image file (", t->dims.size(), " dimensions, expected 3)"));
    const int64_t count = t->dims[0], h = t->dims[1], w = t->dims[2];
    if (absl::GetFlag(FLAGS_index).empty() && count > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, " holds ", count, " images: choose some with --index A:B"));
    }
    auto range = IndexRange(count);
    if (!range.ok()) return range.status();
    const auto [a, b] = *range;
    const std::string_view data = t->data;
    for (int64_t i = a; i < b; ++i) {
      InputImage in;
      in.name = absl::StrCat(f, "[", i, "]");
      in.image = krause::server::RawImageProto(h, w, 1, data.substr(i * h * w, h * w));  // gray
      out.push_back(std::move(in));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("no input files");
  return out;
}

// Images per call for `model` (empty: the server's default of `kind`): --batch, and at most the
// model's max_images_per_request.
absl::StatusOr<int> ImagesPerCall(v1::KrauseService::Stub& stub, const ConnectionOptions& o,
                                  v1::ModelInfo::Kind kind) {
  const int batch = std::max(1, absl::GetFlag(FLAGS_batch));
  grpc::ClientContext ctx;
  krause::client::PrepareContext(o, &ctx);
  v1::ListModelsResponse r;
  const grpc::Status st = stub.ListModels(&ctx, v1::ListModelsRequest(), &r);
  if (!st.ok())
    return absl::UnavailableError(absl::StrCat("list: ", krause::client::Explain(st, o)));
  const std::string want = absl::GetFlag(FLAGS_model);
  for (const auto& m : r.models()) {
    if (want.empty() ? (m.kind() == kind && m.is_default()) : m.name() == want) {
      return m.max_images_per_request() > 0
                 ? std::min<int>(batch, static_cast<int>(m.max_images_per_request()))
                 : batch;
    }
  }
  return batch;  // unknown: the call itself reports NOT_FOUND
}

// --label / --class_index: the class a call asks for (none when neither is given).
struct ClassChoice {
  std::string label;
  int32_t index = -1;
  bool any() const { return !label.empty() || index >= 0; }
};

absl::StatusOr<ClassChoice> ChosenClass() {
  ClassChoice c{absl::GetFlag(FLAGS_label), absl::GetFlag(FLAGS_class_index)};
  if (!c.label.empty() && c.index >= 0)
    return absl::InvalidArgumentError("give --label or --class_index, not both");
  if (c.index < -1) return absl::InvalidArgumentError("--class_index must be >= 0 (or -1: none)");
  return c;
}

// Score: each input's class (-1: none), from --labels_file (an IDX label file sliced like the
// images) or one --label / --class_index for all; empty when none is given.
absl::StatusOr<std::vector<int64_t>> ScoreIndices(size_t n) {
  const std::string file = absl::GetFlag(FLAGS_labels_file);
  if (file.empty()) return std::vector<int64_t>();
  auto t = krause::ReadIdxArray(file);
  if (!t.ok()) return t.status();
  if (t->dims.size() != 1)
    return absl::InvalidArgumentError(absl::StrCat(file, ": not an IDX label file"));
  const int64_t count = t->dims[0];
  auto range = IndexRange(count);
  if (!range.ok())
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", range.status().message()));
  const int64_t a = range->first;
  if (a + static_cast<int64_t>(n) > count) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, " has ", count, " labels; the images need ", a + n));
  }
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(t->data[a + i]);
  return out;
}

std::string Bar(double fraction, int width = 30) {
  const int full = static_cast<int>(fraction * width + 0.5);
  return std::string(full, '#') + std::string(width - full, '.');
}

int List(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json) {
  grpc::ClientContext ctx;
  krause::client::PrepareContext(o, &ctx);
  v1::ListModelsResponse r;
  const grpc::Status st = stub.ListModels(&ctx, v1::ListModelsRequest(), &r);
  if (!st.ok()) return FailRpc("list", st, o);
  if (as_json) {
    json j = json::array();
    for (const auto& m : r.models()) {
      json t = {{"name", m.name()},
                {"version", m.version()},
                {"kind", v1::ModelInfo::Kind_Name(m.kind())},
                {"attention", v1::ModelInfo::Attention_Name(m.attention())},
                {"default", m.is_default()},
                {"shape", {m.height(), m.width(), m.channels()}},
                {"labels", std::vector<std::string>(m.labels().begin(), m.labels().end())},
                {"classes", m.classes()},
                {"window", m.window()},
                {"top_k", std::vector<uint32_t>(m.top_k().begin(), m.top_k().end())},
                {"parameters", m.parameters()},
                {"flops_per_image_executed", m.flops_per_image_executed()},
                {"flops_per_image_dense_equivalent", m.flops_per_image_dense_equivalent()},
                {"device", m.device()},
                {"implementation", m.implementation()},
                {"weights_dtype", m.weights_dtype()},
                {"precision", m.precision()},
                {"max_batch_size", m.max_batch_size()},
                {"max_images_per_request", m.max_images_per_request()}};
      if (!m.cpu_kernels().empty()) t["cpu_kernels"] = m.cpu_kernels();
      if (!m.linear_kernels().empty()) t["linear_kernels"] = m.linear_kernels();
      if (!m.precision_fallback().empty()) t["precision_fallback"] = m.precision_fallback();
      if (!m.kv_cache_dtype().empty()) {
        t["kv_cache_dtype"] = m.kv_cache_dtype();
        t["kv_cache_bytes_per_sequence"] = m.kv_cache_bytes_per_sequence();
      }
      json checks = json::array();
      for (const auto& c : m.kernel_checks())
        checks.push_back({{"implementation", c.implementation()},
                          {"device", c.device()},
                          {"result", c.result()},
                          {"max_abs_diff", c.max_abs_diff()},
                          {"tolerance", c.tolerance()},
                          {"detail", c.detail()},
                          {"seconds", c.seconds()}});
      t["kernel_checks"] = checks;
      j.push_back(t);
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%-20s %-4s %-10s %-8s %-9s %-15s %10s %9s %9s %7s  %s\n", "NAME", "VER", "KIND",
              "ATTN", "SHAPE", "IMPL", "PARAMS", "MFLOP/IMG", "DENSE-EQ", "SAVING", "DEFAULT");
  for (const auto& m : r.models()) {
    const double ex = m.flops_per_image_executed() / 1e6,
                 de = m.flops_per_image_dense_equivalent() / 1e6;
    // IMPL: what the kernel check chose, and where ("fused_cpu/cpu", "windowed/cuda:0").
    std::printf("%-20s %-4s %-10s %-8s %-9s %-15s %10llu %9.2f %9.2f %6.1f%%  %s\n",
                m.name().c_str(), m.version().c_str(), v1::ModelInfo::Kind_Name(m.kind()).c_str(),
                v1::ModelInfo::Attention_Name(m.attention()).c_str(),
                absl::StrCat(m.height(), "x", m.width(), "x", m.channels()).c_str(),
                absl::StrCat(m.implementation(), "/", m.device()).c_str(),
                static_cast<unsigned long long>(m.parameters()), ex, de,
                de > 0 ? 100.0 * (1.0 - ex / de) : 0.0, m.is_default() ? "yes" : "");
  }
  return 0;
}

int Health(const std::shared_ptr<grpc::Channel>& channel, const ConnectionOptions& o,
           bool as_json) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  krause::client::PrepareContext(o, &ctx);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse r;
  const grpc::Status st = stub->Check(&ctx, req, &r);
  if (!st.ok()) return FailRpc("health", st, o);
  const std::string status = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(r.status());
  if (as_json) {
    std::cout << json{{"service", req.service()}, {"status", status}}.dump() << "\n";
  } else {
    std::printf("%s\n", status.c_str());
  }
  return r.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

int Classify(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
             const std::vector<std::string>& files) {
  auto inputs = ReadInputs(files);
  if (!inputs.ok()) return Fail(inputs.status().ToString());
  auto per_call = ImagesPerCall(stub, o, v1::ModelInfo::CLASSIFIER);
  if (!per_call.ok()) return Fail(per_call.status().ToString());
  const int batch = *per_call;
  json results = json::array();
  double executed = 0, dense = 0;
  for (size_t s = 0; s < inputs->size(); s += batch) {
    v1::ClassifyRequest req;
    req.set_model(absl::GetFlag(FLAGS_model));
    req.set_version(absl::GetFlag(FLAGS_model_version));
    req.set_top_k(static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_top))));
    const size_t e = std::min(inputs->size(), s + batch);
    for (size_t i = s; i < e; ++i) *req.add_images() = (*inputs)[i].image;
    grpc::ClientContext ctx;
    krause::client::PrepareContext(o, &ctx);
    v1::ClassifyResponse r;
    const grpc::Status st = stub.Classify(&ctx, req, &r);
    if (!st.ok()) return FailRpc("classify", st, o);
    executed += r.flops_executed();
    dense += r.flops_dense_equivalent();
    for (int i = 0; i < r.results_size(); ++i) {
      const std::string& name = (*inputs)[s + i].name;
      json top = json::array();
      std::string line = name + ":";
      for (const auto& c : r.results(i).top()) {
        top.push_back(
            {{"index", c.index()}, {"label", c.label()}, {"probability", c.probability()}});
        absl::StrAppend(&line, "  ", c.label().empty() ? absl::StrCat(c.index()) : c.label(), " ",
                        absl::StrFormat("%.3f", c.probability()));
      }
      results.push_back({{"input", name}, {"model", r.model()}, {"top", top}});
      if (!as_json) std::printf("%s\n", line.c_str());
    }
  }
  if (as_json) {
    std::cout << json{{"results", results},
                      {"flops_executed", executed},
                      {"flops_dense_equivalent", dense}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("FLOPs: %.4g executed, %.4g dense-equivalent (%.1f%% saved)\n", executed, dense,
                dense > 0 ? 100.0 * (1 - executed / dense) : 0.0);
  }
  return 0;
}

int Generate(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
             const std::string& prompt_file) {
  v1::GenerateRequest req;
  req.set_model(absl::GetFlag(FLAGS_model));
  req.set_version(absl::GetFlag(FLAGS_model_version));
  req.set_num_images(static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_num))));
  if (absl::GetFlag(FLAGS_seed) >= 0)
    req.set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  // Negative: unset, so that the model's sampling defaults apply.
  if (absl::GetFlag(FLAGS_temperature) >= 0)
    req.set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  if (absl::GetFlag(FLAGS_top_p) >= 0)
    req.set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  req.set_top_k(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_top_k))));
  req.set_stream_rows(false);  // the client only needs the progress and the final PNGs
  auto cls = ChosenClass();
  if (!cls.ok()) return Fail(cls.status().ToString());
  if (!cls->label.empty()) req.set_label(cls->label);
  if (cls->index >= 0) req.set_class_index(static_cast<uint32_t>(cls->index));
  if (absl::GetFlag(FLAGS_guidance) >= 0)
    req.set_guidance(static_cast<float>(absl::GetFlag(FLAGS_guidance)));
  if (!prompt_file.empty()) {
    auto bytes = krause::ReadFileToString(prompt_file);
    if (!bytes.ok()) return Fail(bytes.status().ToString());
    req.mutable_prompt()->set_png(std::move(*bytes));
    req.set_prompt_rows(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_rows))));
  }
  const std::string out_dir = absl::GetFlag(FLAGS_out);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  krause::client::ResumeOptions ro;
  ro.resume = absl::GetFlag(FLAGS_resume);
  ro.max_resumes = std::max(0, absl::GetFlag(FLAGS_max_resumes));
  ro.deadline_seconds = o.timeout_seconds;
  ro.attempt_timeout_seconds = absl::GetFlag(FLAGS_attempt_timeout);
  krause::client::ResumingGenerate reader(&stub, o, req, ro);
  v1::GenerateResponse msg;
  std::vector<std::string> written;
  v1::GenerateSummary summary;
  const bool progress = absl::GetFlag(FLAGS_progress) && !as_json;
  const auto start = std::chrono::steady_clock::now();
  while (reader.Read(&msg)) {
    for (const auto& im : msg.images()) {
      const std::string path = (std::filesystem::path(out_dir) /
                                absl::StrCat(absl::GetFlag(FLAGS_prefix), "-", im.image(), ".png"))
                                   .string();
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f) return Fail(absl::StrCat(path, ": cannot write"));
      std::fwrite(im.png().data(), 1, im.png().size(), f);
      std::fclose(f);
      written.push_back(path);
    }
    if (progress) {
      const auto& p = msg.progress();
      const double frac = p.pixels_total() ? double(p.pixels_done()) / p.pixels_total() : 1.0;
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\r[%s] %5.1f%% %llu/%llu px  images %u/%u  %.1fs eta %.1fs ",
                   Bar(frac).c_str(), 100 * frac, static_cast<unsigned long long>(p.pixels_done()),
                   static_cast<unsigned long long>(p.pixels_total()), p.images_done(),
                   p.images_total(), el, frac > 0 ? el / frac - el : 0.0);
    }
    if (msg.has_summary()) summary = msg.summary();
  }
  if (progress) std::fprintf(stderr, "\n");
  const grpc::Status st = reader.Finish();
  const krause::client::ResumeStats rs = reader.stats();
  for (const std::string& b : rs.breaks)
    std::fprintf(stderr, "stream broke (%s)%s\n", b.c_str(), ro.resume ? "; resuming" : "");
  if (!st.ok()) return FailRpc(prompt_file.empty() ? "generate" : "complete", st, o);
  if (as_json) {
    std::cout << json{{"model", summary.model()},
                      {"files", written},
                      {"images", summary.images()},
                      {"pixels_generated", summary.pixels_generated()},
                      {"seconds", summary.seconds()},
                      {"seconds_to_first_pixel", summary.seconds_to_first_pixel()},
                      {"seed", summary.seed()},
                      {"flops_executed", summary.flops_executed()},
                      {"flops_dense_equivalent", summary.flops_dense_equivalent()},
                      {"model_version", summary.model_version()},
                      {"resumed_streams", rs.resumed_calls},
                      {"images_resumed", rs.images_resumed},
                      {"rows_kept", rs.rows_kept},
                      {"rows_recomputed", rs.rows_recomputed}}
                     .dump(2)
              << "\n";
  } else {
    for (const auto& w : written) std::printf("wrote %s\n", w.c_str());
    std::printf("%s: %u image(s), %llu pixels in %.2f s (first pixel after %.3f s), seed %llu\n",
                summary.model().c_str(), summary.images(),
                static_cast<unsigned long long>(summary.pixels_generated()), summary.seconds(),
                summary.seconds_to_first_pixel(), static_cast<unsigned long long>(summary.seed()));
    std::printf("FLOPs: %.4g executed, %.4g dense-equivalent (%.1f%% saved)\n",
                summary.flops_executed(), summary.flops_dense_equivalent(),
                summary.flops_dense_equivalent() > 0
                    ? 100.0 * (1 - summary.flops_executed() / summary.flops_dense_equivalent())
                    : 0.0);
    if (rs.resumed_calls > 0)
      std::printf(
          "resumed: %lld stream(s) broke; %lld image(s) continued on %lld call(s), "
          "%lld row(s) kept, %lld row(s) recomputed\n",
          static_cast<long long>(rs.breaks.size()), static_cast<long long>(rs.images_resumed),
          static_cast<long long>(rs.resumed_calls), static_cast<long long>(rs.rows_kept),
          static_cast<long long>(rs.rows_recomputed));
  }
  return 0;
}

int Score(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
          const std::vector<std::string>& files) {
  auto inputs = ReadInputs(files);
  if (!inputs.ok()) return Fail(inputs.status().ToString());
  auto cls = ChosenClass();
  if (!cls.ok()) return Fail(cls.status().ToString());
  auto indices = ScoreIndices(inputs->size());
  if (!indices.ok()) return Fail(indices.status().ToString());
  if (cls->any() && !indices->empty())
    return Fail("give --labels_file or one --label / --class_index, not both");
  auto per_call = ImagesPerCall(stub, o, v1::ModelInfo::GENERATOR);
  if (!per_call.ok()) return Fail(per_call.status().ToString());
  const int batch = *per_call;
  json results = json::array();
  double sum = 0;
  std::string model;
  for (size_t s = 0; s < inputs->size(); s += batch) {
    v1::ScoreRequest req;
    req.set_model(absl::GetFlag(FLAGS_model));
    req.set_version(absl::GetFlag(FLAGS_model_version));
    const size_t e = std::min(inputs->size(), s + batch);
    for (size_t i = s; i < e; ++i) {
      *req.add_images() = (*inputs)[i].image;
      if (!cls->label.empty()) req.add_labels(cls->label);
      if (cls->index >= 0) req.add_class_indices(cls->index);
      if (!indices->empty()) req.add_class_indices(static_cast<int32_t>((*indices)[i]));
    }
    grpc::ClientContext ctx;
    krause::client::PrepareContext(o, &ctx);
    v1::ScoreResponse r;
    const grpc::Status st = stub.Score(&ctx, req, &r);
    if (!st.ok()) return FailRpc("score", st, o);
    model = r.model();
    for (int i = 0; i < r.bits_per_dim_size(); ++i) {
      sum += r.bits_per_dim(i);
      results.push_back({{"input", (*inputs)[s + i].name}, {"bits_per_dim", r.bits_per_dim(i)}});
      if (!as_json)
        std::printf("%s: %.4f bits/dim\n", (*inputs)[s + i].name.c_str(), r.bits_per_dim(i));
    }
  }
  const double mean = sum / static_cast<double>(inputs->size());
  if (as_json) {
    std::cout << json{{"model", model}, {"results", results}, {"mean_bits_per_dim", mean}}.dump(2)
              << "\n";
  } else {
    std::printf("%s: mean %.4f bits/dim over %zu image(s) in %zu call(s)%s\n", model.c_str(), mean,
                inputs->size(), (inputs->size() + batch - 1) / batch,
                cls->any() || !indices->empty() ? ", given the classes" : "");
  }
  return 0;
}

int Inspect(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
            const std::string& file) {
  auto inputs = ReadInputs({file});
  if (!inputs.ok()) return Fail(inputs.status().ToString());
  if (inputs->size() != 1)
    return Fail(absl::StrCat(file, ": inspect takes one image (choose it with --index I)"));
  auto cls = ChosenClass();
  if (!cls.ok()) return Fail(cls.status().ToString());
  krause::client::InspectArgs a;
  a.model = absl::GetFlag(FLAGS_model);
  a.version = absl::GetFlag(FLAGS_model_version);
  for (auto [flag, text, out] : {std::tuple{"layer", absl::GetFlag(FLAGS_layer), &a.layers},
                                 std::tuple{"head", absl::GetFlag(FLAGS_head), &a.heads},
                                 std::tuple{"query", absl::GetFlag(FLAGS_query), &a.queries}}) {
    auto list = krause::client::ParseIndexList(text, flag);
    if (!list.ok()) return Fail(list.status().ToString());
    *out = std::move(*list);
  }
  a.top_k = absl::GetFlag(FLAGS_top_k);
  a.label = cls->label;
  a.class_index = cls->index;
  a.out = absl::GetFlag(FLAGS_out);
  a.summary = absl::GetFlag(FLAGS_summary);
  a.as_json = as_json;
  return krause::client::Inspect(stub, o, (*inputs)[0].image, (*inputs)[0].name, a);
}

}  // namespace

int main(int argc, char** argv) {
  krause::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "the command-line client of krause-server.\n"
      "  krause-client list\n"
      "  krause-client health [--service krause.v1.KrauseService]\n"
      "  krause-client classify FILE... [--index A:B] [--top 3]     (PNG files or IDX files)\n"
      "  krause-client generate [--num 4] [--seed 1] [--label Sneaker] [--out DIR]\n"
      "  krause-client complete PROMPT.png --rows 14 [--num 4] [--label Sneaker] [--out DIR]\n"
      "  krause-client score FILE... [--index A:B] [--label NAME | --labels_file IDX]\n"
      "  krause-client inspect FILE [--index I] [--layer L] [--head H] [--query Q] [--out DIR]\n"
      "                [--summary] [--top_k K]   (what the attention keeps: PNG heatmaps)\n"
      "  krause-client models index [--ready]    (model control; an admin token with auth)\n"
      "  krause-client models load NAME [--model_version V]\n"
      "  krause-client models unload NAME [--model_version V]\n"
      "classify and score split the images into calls the model accepts; score prints the mean.\n"
      "--label / --class_index: the class of a conditional generator (list --json shows its\n"
      "labels).\n"
      "Common: --server host:port, --model NAME, --json, --timeout S, --tls/--tls_ca/--tls_cert/\n"
      "--tls_key, --token/--token_file. Exit code 0 on success, 1 on an error, 2 on bad usage.");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr,
                 "krause-client: a command is required (list, health, classify, generate, "
                 "complete, score, inspect, models); see --help\n");
    return 2;
  }
  const std::string cmd = args[1];
  std::vector<std::string> rest(args.begin() + 2, args.end());
  ConnectionOptions o;
  o.server = absl::GetFlag(FLAGS_server);
  o.retry = absl::GetFlag(FLAGS_retry);
  o.tls = absl::GetFlag(FLAGS_tls);
  o.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.token = absl::GetFlag(FLAGS_token);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.timeout_seconds = absl::GetFlag(FLAGS_timeout);
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    auto t = krause::ReadFileToString(absl::GetFlag(FLAGS_token_file));
    if (!t.ok()) return Fail(t.status().ToString());
    o.token = std::string(absl::StripAsciiWhitespace(*t));
  }
  auto channel = krause::client::MakeChannel(o);
  if (!channel.ok()) return Fail(channel.status().ToString());
  auto stub = v1::KrauseService::NewStub(*channel);
  const bool as_json = absl::GetFlag(FLAGS_json);
  if (cmd == "list" && rest.empty()) return List(*stub, o, as_json);
  if (cmd == "health" && rest.empty()) return Health(*channel, o, as_json);
  if (cmd == "classify" && !rest.empty()) return Classify(*stub, o, as_json, rest);
  if (cmd == "score" && !rest.empty()) return Score(*stub, o, as_json, rest);
  if (cmd == "inspect" && rest.size() == 1) return Inspect(*stub, o, as_json, rest[0]);
  if (cmd == "generate" && rest.empty()) return Generate(*stub, o, as_json, "");
  if (cmd == "complete" && rest.size() == 1) return Generate(*stub, o, as_json, rest[0]);
  if (cmd == "models" && !rest.empty())
    return krause::client::Models(*stub, o, as_json, rest, absl::GetFlag(FLAGS_model_version),
                                  absl::GetFlag(FLAGS_ready));
  std::fprintf(stderr, "krause-client: bad usage of \"%s\"; see --help\n", cmd.c_str());
  return 2;
}
