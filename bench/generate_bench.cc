// krause-generate-bench: KARM vs ARM generation throughput side by side (random weights).
//
// Configs: the paper's MNIST model (28x28x1, d 256, 12 layers, 8 heads, W 128, k 96) and CIFAR-10
// model (32x32x3, d 512, 16 layers, 8 heads, W 256, k 192), each as KARM and as the softmax ARM
// of the same size (preallocated full-length KV cache, the same batching).
// For S concurrent sequences it reports:
//   step time at sampled positions: one batched decode step (batch-invariant linears, as the
//     engine runs it) of S sequences at position p, median of several runs;
//   images/s, by one of two methods, recorded in each record's "method":
//     "full":       the engine generates S images end to end (wall time);
//     "integrated": S / (sum over all N positions of the step time interpolated linearly between
//                   the sampled positions). Validated against "full" on the MNIST config: the
//                   table prints both and their ratio.
//   KV bytes per sequence.
// On the CPU each model is measured twice, with its linear weights in fp32 and in bfloat16
// (ParameterStore::RoundLinear; methods step_w16, integ_w16, full_w16), and the KARM once more
// over bf16 ring caches (step_bf16e, integ_bf16e, full_bf16).
// Ratios come from one run. --json writes one record per measurement.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/progress.h"
#include "model/engine/cpu_decoder.h"
#include "model/engine/decode_engine.h"
#include "model/engine/decode_graphs.h"
#include "model/engine/device_context.h"
#include "model/kv_cache.h"
#include "model/pixel_model.h"
#include "model/util/threads.h"

namespace krause::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string json_path;
  bool quick = false;
  std::string only;  // "mnist" or "cifar"
  std::string device = "cpu";
  std::vector<int64_t> streams;  // empty: {1, 16, 64} ({1, 16} with --quick)
  // --repeat_step CONFIG,ATTENTION,S,POSITION,STEPS: only that decode step, STEPS times.
  std::string repeat_step;
};

struct Record {
  std::string model, attention, image, method;
  int64_t streams = 0, position = -1;
  double images_per_second = 0, step_seconds = 0;
  int64_t kv_bytes_per_sequence = 0;
  std::string device = "cpu";
};

std::string ToJson(const Record& r) {
  return absl::StrFormat(
      "{\"model\":\"%s\",\"attention\":\"%s\",\"image\":\"%s\",\"streams\":%d,\"method\":\"%s\","
      "\"images_per_second\":%.6g,\"step_seconds\":%.6g,\"position\":%d,\"kv_bytes_per_sequence\":%"
      "d,\"device\":\"%s\"}",
      r.model, r.attention, r.image, r.streams, r.method, r.images_per_second, r.step_seconds,
      r.position, r.kv_bytes_per_sequence, r.device);
}

PixelModelConfig PaperConfig(const std::string& which, const std::string& attention) {
  PixelModelConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.start_token = true;
  if (which == "mnist") {
    c.height = c.width_px = 28;
    c.channels = 1;
    c.d_model = 256;
    c.depth = 12;
    c.heads = 8;
    c.window = 128;
    c.top_k = 96;
  } else {
    c.height = c.width_px = 32;
    c.channels = 3;
    c.d_model = 512;
    c.depth = 16;
    c.heads = 8;
    c.window = 256;
    c.top_k = 192;
  }
  return c;
}

// The per-position step records: eager, graphed (CUDA), graphed over a bf16 cache (CUDA), eager
// over a bf16 cache (a KARM on the CPU), eager with bf16 linear weights (the CPU).
struct StepMethod {
  const char* method;
  const char* label;
};
constexpr StepMethod kStepMethods[] = {{"step", ""},
                                       {"step_graph", "graphed "},
                                       {"step_bf16", "graphed bf16-cache "},
                                       {"step_bf16e", "bf16-cache "},
                                       {"step_w16", "bf16-weights "}};

bool IsStepMethod(const std::string& method) {
  for (const StepMethod& m : kStepMethods)
    if (method == m.method) return true;
  return false;
}

using StepFn = std::function<at::Tensor(const at::Tensor& u, const at::Tensor& positions,
                                        const at::Tensor& slots)>;

// Median time of one decode step of S sequences at `position`, caches filled with random
// history (what the step reads; its cost does not depend on the values). The first `warmup`
// steps are not timed (a graphed step captures at its second).
double StepSeconds(const StepFn& step, int64_t s, int64_t position, int reps, int warmup = 1) {
  const at::Tensor u = at::randint(0, 256, {s}, at::kLong);
  const at::Tensor pos = at::full({s}, position, at::kLong);
  const at::Tensor slots = at::arange(s, at::kLong);
  std::vector<double> t;
  for (int r = 0; r < reps + warmup; ++r) {
    const auto t0 = Clock::now();
    // Logits back on the host, as the engine needs them (waits for a GPU).
    (void)step(u, pos, slots).cpu();
    if (r >= warmup) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Seconds to generate a whole image of n subpixels: the step times at the sampled positions,
// interpolated linearly over every position 0..n-1.
double IntegratedSeconds(const std::vector<int64_t>& positions, const std::vector<double>& times) {
  double total = 0;
  for (size_t i = 0; i + 1 < positions.size(); ++i) {
    const int64_t span = positions[i + 1] - positions[i];
    total += span * (times[i] + times[i + 1]) / 2;
  }
  return total + times.back();
}

// Bytes read and written per second by a device-to-device copy of 2 x 2 GiB (median of 5, after
// a warm-up): what this device's memory gives a plain streaming kernel, measured in the same run
// as the decode steps it is compared with.
double CopyBytesPerSecond(const at::Device& device) {
  const int64_t floats = int64_t{512} << 20;  // 2 GiB
  at::Tensor src = at::ones({floats}, at::TensorOptions().dtype(at::kFloat).device(device));
  at::Tensor dst = at::empty_like(src);
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    (void)dst[0].item<float>();  // the stream is idle
    const auto t0 = Clock::now();
    dst.copy_(src);
    (void)dst[floats - 1].item<float>();  // waits for the copy
    if (r > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return 2.0 * static_cast<double>(floats) * 4 / t[t.size() / 2];
}

// The CPU's memory read bandwidth, measured in the same run: ATen's vectorised, multithreaded sum
// of 1 GiB of floats (far over the caches), median of 5 after a warm-up; bytes read per second.
double CpuReadBytesPerSecond() {
  const int64_t floats = int64_t{256} << 20;  // 1 GiB
  const at::Tensor src = at::ones({floats}, at::kFloat);
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = Clock::now();
    (void)src.sum().item<float>();
    if (r > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return static_cast<double>(floats) * 4 / t[t.size() / 2];
}

void FillRandom(const PixelModelConfig& c, PixelKvCache* cache) {
  at::NoGradGuard g;
  for (int64_t l = 0; l < c.depth; ++l) {
    // Krause {keys_t, values, bias}: the biases are the keys'; softmax {keys, values}.
    std::vector<at::Tensor> storage = cache->layer(l).Storage();
    storage[0].normal_();
    storage[1].normal_();
    if (cache->kind() == AttentionKind::kKrause) {
      storage[2].copy_(-0.5 * storage[0].pow(2).sum(2));
    }
  }
}

// Images/s of S sequences generated end to end by the engine (its caches in `cache_dtype`).
double FullRun(const PixelModel& m, int64_t s, at::ScalarType cache_dtype = at::kFloat) {
  EngineOptions options{s, 0};
  options.cache_dtype = cache_dtype;
  auto engine = DecodeEngine::Create(&m, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "\nengine: %s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  int64_t done = 0;
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < s; ++i) {
    GenerationRequest r;
    r.sampling.seed = static_cast<uint64_t>(i);
    if (!(*engine)->Submit(std::move(r)).ok()) std::exit(1);
  }
  for (const auto& [id, f] : RunUntilIdle(engine->get())) done += f.status.ok();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (done != s) std::exit(1);
  return s / secs;
}

// --repeat_step: one decode step of the engine's kind (packed on the CPU) over caches of random
// history, repeated; prints the median step time. Everything else the bench does is left out, so
// that a profiler sees the step alone.
int RepeatStep(const std::string& spec, const std::string& device_name) {
  const std::vector<std::string> f = absl::StrSplit(spec, ',');
  int64_t s = 0, position = 0, steps = 0;
  if ((f.size() != 5 && f.size() != 6) || (f[0] != "mnist" && f[0] != "cifar") ||
      (f[1] != "krause" && f[1] != "softmax") || !absl::SimpleAtoi(f[2], &s) || s < 1 ||
      !absl::SimpleAtoi(f[3], &position) || position < 0 || !absl::SimpleAtoi(f[4], &steps) ||
      steps < 1 || (f.size() == 6 && f[5] != "float32" && f[5] != "bfloat16")) {
    std::fprintf(stderr,
                 "--repeat_step: CONFIG (mnist|cifar),ATTENTION (krause|softmax),S,POSITION,STEPS"
                 "[,CACHE (float32|bfloat16)]\n");
    return 2;
  }
  const at::ScalarType cache_dtype =
      f.size() == 6 && f[5] == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const PixelModelConfig c = PaperConfig(f[0], f[1]);
  if (position >= c.seq_len()) {
    std::fprintf(stderr, "--repeat_step: position must be < %lld\n",
                 static_cast<long long>(c.seq_len()));
    return 2;
  }
  const at::Device device(device_name);
  auto model = PixelModel::Create(c, 1);
  if (!model.ok()) return 1;
  model->parameters().To(device);
  const PixelDecodeWeights packed = PackForDecode(*model);
  auto cache = PixelKvCache::Create(c, s, device, cache_dtype);
  if (!cache.ok()) {
    std::fprintf(stderr, "--repeat_step: %s\n", cache.status().ToString().c_str());
    return 1;
  }
  FillRandom(c, &*cache);
  const double t = StepSeconds(
      [&](const at::Tensor& u, const at::Tensor& pos, const at::Tensor& sl) {
        return model->DecodeStep(u, pos, sl, &*cache, &packed);
      },
      s, position, static_cast<int>(steps));
  std::printf("%s %s S=%lld position %lld%s: %.3f ms per step (median of %lld)\n", f[0].c_str(),
              f[1].c_str(), static_cast<long long>(s), static_cast<long long>(position),
              cache_dtype == at::kBFloat16 ? " (bf16 cache)" : "", t * 1e3,
              static_cast<long long>(steps));
  return 0;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      o.json_path = argv[++i];
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      o.only = argv[++i];
    } else if (a == "--device" && i + 1 < argc) {
      o.device = argv[++i];
    } else if (a == "--streams" && i + 1 < argc) {
      for (absl::string_view v : absl::StrSplit(argv[++i], ',')) {
        int64_t s = 0;
        if (!absl::SimpleAtoi(v, &s) || s < 1) {
          std::fprintf(stderr, "--streams: comma-separated counts >= 1\n");
          return 2;
        }
        o.streams.push_back(s);
      }
    } else if (a == "--repeat_step" && i + 1 < argc) {
      o.repeat_step = argv[++i];
    } else if (a == "--help") {
      std::printf(
          "krause-generate-bench: KARM vs ARM generation throughput (random weights).\n"
          "  --quick         streams {1, 16}, fewer positions, MNIST full runs only for S = 1\n"
          "  --only NAME     mnist or cifar\n"
          "  --device D      cpu (default; batch-invariant packed decode weights) or cuda[:N]\n"
          "  --streams LIST  concurrent sequences, e.g. 1,64,200 (default 1,16,64)\n"
          "  --json FILE     one JSON record per measurement\n"
          "  --repeat_step CONFIG,ATTENTION,S,POSITION,STEPS[,CACHE]\n"
          "                  only one decode step (e.g. mnist,krause,64,700,150), STEPS times,\n"
          "                  and its median time: a steady load to profile (perf record -g);\n"
          "                  CACHE float32 (default) or bfloat16 (a KARM's ring caches)\n"
          "On the CPU the KARM is also measured over bf16 ring caches (rows bf16-cache,\n"
          "integ_bf16e, full_bf16) beside its fp32 ones, and both models with bf16 linear\n"
          "weights (rows bf16-weights, integ_w16, full_w16) beside fp32 ones.\n");
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  krause::SetCpuThreads(0);
  at::NoGradGuard no_grad;
  if (!o.repeat_step.empty()) return RepeatStep(o.repeat_step, o.device);
  std::vector<int64_t> streams =
      o.quick ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 16, 64};
  if (!o.streams.empty()) streams = o.streams;
  at::Device device(at::kCPU);
  try {
    device = at::Device(o.device);
  } catch (const std::exception&) {
    std::fprintf(stderr, "--device: cpu, cuda or cuda:N\n");
    return 2;
  }
  if (device.is_cuda() && !at::hasCUDA()) {
    std::fprintf(stderr, "--device %s: no CUDA device\n", o.device.c_str());
    return 1;
  }
  std::vector<std::string> configs;
  for (const char* c : {"mnist", "cifar"})
    if (o.only.empty() || o.only == c) configs.push_back(c);

  Progress progress;
  for (const auto& cfg : configs) {
    progress.total += 2 * static_cast<int>(streams.size()) * (cfg == "mnist" ? 2 : 1);
    if (device
            .is_cpu()) {  // the KARM's bf16-cache steps, both models' bf16 weights (and full runs)
      progress.total += 3 * static_cast<int>(streams.size()) * (cfg == "mnist" ? 2 : 1);
    }
  }
  // What the decode step's bytes per second are measured against: a device-to-device copy on a
  // GPU, the CPU's read bandwidth on the CPU.
  const double copy_bps = device.is_cuda() ? CopyBytesPerSecond(device) : CpuReadBytesPerSecond();
  std::vector<Record> records;
  std::vector<std::string> lines;
  std::map<std::string, int64_t> param_bytes;  // per config + model
  for (const std::string& which : configs) {
    for (const std::string attention : {"krause", "softmax"}) {
      const PixelModelConfig c = PaperConfig(which, attention);
      auto model = PixelModel::Create(c, 1);
      if (!model.ok()) return 1;
      model->parameters().To(device);
      // The engine's choice: packed batch-invariant linear layers on the CPU, plain ones on a
      // GPU; the Krause layers' scales validated once on either.
      const PixelDecodeWeights packed = PackForDecode(*model);
      // On the CPU, the same model with bf16 linear weights (packed in half the bytes).
      std::optional<PixelModel> model16;
      std::optional<PixelDecodeWeights> packed16;
      if (device.is_cpu()) {
        model16.emplace(PixelModel::Create(c, 1).value());
        if (!model16->parameters().RoundLinear(at::kBFloat16).ok()) return 1;
        packed16.emplace(PackForDecode(*model16));
      }
      const int64_t n = c.seq_len();
      const std::string image = absl::StrFormat("%dx%dx%d", c.height, c.width_px, c.channels);
      const std::string name = attention == "krause" ? "KARM" : "ARM";
      param_bytes[which + name] = model->parameters().NumParameters() * 4;
      if (packed16) {  // the packed linears' bytes are what bf16 halves
        const auto bytes = [](const PixelDecodeWeights& w) {
          return dynamic_cast<const CpuDecoder&>(*w.cpu).weight_bytes();
        };
        param_bytes[which + name + "w16"] =
            param_bytes[which + name] - bytes(packed) + bytes(*packed16);
      }
      std::vector<int64_t> positions;
      const int samples = o.quick ? 5 : 9;
      for (int i = 0; i < samples; ++i) positions.push_back(i * (n - 1) / (samples - 1));
      if (which == "cifar") {
        positions.push_back(300);
        positions.push_back(3000);
        std::sort(positions.begin(), positions.end());
      }
      for (int64_t s : streams) {
        auto cache = PixelKvCache::Create(c, s, device);
        if (!cache.ok()) return 1;
        FillRandom(c, &*cache);
        const int reps = s >= 16 ? 3 : 7;
        // One decode step (`step`, the first `warmup` calls untimed) at every sampled position,
        // as `step_method` records; and the images/s such times integrate to.
        auto sweep = [&](const StepFn& step, int warmup, const char* step_method,
                         at::ScalarType dtype) {
          std::vector<double> times;
          for (int64_t p : positions) {
            times.push_back(StepSeconds(step, s, p, reps, warmup));
            records.push_back({which, name, image, step_method, s, p, 0, times.back(),
                               PixelKvCache::BytesPerSequence(c, dtype)});
          }
          return times;
        };
        auto integrate = [&](const std::vector<double>& times, const char* integrated_method,
                             at::ScalarType dtype) {
          const double total = IntegratedSeconds(positions, times);
          records.push_back({which, name, image, integrated_method, s, -1, s / total, total / n,
                             PixelKvCache::BytesPerSequence(c, dtype)});
        };
        // The eager step over `steps_cache` (of `m` and its packed weights `w`).
        auto eager = [&](PixelKvCache* steps_cache, const char* step_method,
                         const char* integrated_method, at::ScalarType dtype,
                         const PixelModel* m = nullptr, const PixelDecodeWeights* w = nullptr) {
          if (m == nullptr) m = &*model;
          if (w == nullptr) w = &packed;
          const StepFn step = [&](const at::Tensor& u, const at::Tensor& pos,
                                  const at::Tensor& sl) {
            return m->DecodeStep(u, pos, sl, steps_cache, w);
          };
          integrate(sweep(step, 1, step_method, dtype), integrated_method, dtype);
        };
        eager(&*cache, "step", "integrated", at::kFloat);
        // The KARM on a GPU once more with its decode step replayed as a CUDA graph, on a stream
        // of its own as in the engine: over the fp32 cache, then over a bf16 one (half the bytes).
        // A graphed step captures at its second call.
        auto graphed = [&](PixelKvCache* graph_cache, const char* step_method,
                           const char* integrated_method, at::ScalarType dtype) {
          const DeviceContext ctx(device);
          ctx.WaitForDefaultStream();
          const std::shared_ptr<void> scope = ctx.Enter();
          DecodeGraphs graphs(&*model, graph_cache, &packed, s);
          const std::vector<double> times =
              sweep([&](const at::Tensor& u, const at::Tensor& pos,
                        const at::Tensor& sl) { return graphs.Step(u, pos, sl); },
                    /*warmup=*/2, step_method, dtype);
          if (!graphs.enabled()) {
            std::fprintf(stderr, "\nCUDA graphs off: %s\n", graphs.reason().c_str());
            return;
          }
          integrate(times, integrated_method, dtype);
        };
        if (DecodeGraphs::Supported(*model)) {
          graphed(&*cache, "step_graph", "integ_graph", at::kFloat);
          auto bf16 = PixelKvCache::Create(c, s, device, at::kBFloat16);
          if (bf16.ok()) {
            FillRandom(c, &*bf16);
            graphed(&*bf16, "step_bf16", "integ_bf16", at::kBFloat16);
          } else {
            std::fprintf(stderr, "\nbf16 cache: %s\n", bf16.status().ToString().c_str());
          }
        }
        progress.Step(absl::StrFormat("%s %s S=%d steps", which, name, s));
        const bool full_run = which == "mnist" && !(o.quick && s > 1);
        // The engine end to end (MNIST; with --quick only S = 1) on `m`, as record `method`.
        auto full = [&](const PixelModel& m, const char* method, const char* label,
                        at::ScalarType dtype) {
          if (full_run) {
            const double ips = FullRun(m, s, dtype);
            records.push_back({which, name, image, method, s, -1, ips, s / ips / n,
                               PixelKvCache::BytesPerSequence(c, dtype)});
            progress.Step(absl::StrFormat("%s %s S=%d %sfull run", which, name, s, label));
          } else if (which == "mnist") {
            progress.Step("skipped");
          }
        };
        full(*model, "full", "", at::kFloat);
        // On the CPU, the model with bf16 linear weights over the same fp32 cache.
        if (packed16) {
          eager(&*cache, "step_w16", "integ_w16", at::kFloat, &*model16, &*packed16);
          progress.Step(absl::StrFormat("%s %s S=%d bf16-weights steps", which, name, s));
          full(*model16, "full_w16", "bf16-weights ", at::kFloat);
        }
        // The KARM on the CPU once more over bf16 ring caches (the decode kernel widens their
        // elements; half the key and value bytes), step by step and, for MNIST, end to end.
        if (device.is_cpu() && attention == "krause") {
          auto bf16 = PixelKvCache::Create(c, s, device, at::kBFloat16);
          if (!bf16.ok()) {
            std::fprintf(stderr, "\nbf16 cache: %s\n", bf16.status().ToString().c_str());
            return 1;
          }
          FillRandom(c, &*bf16);
          eager(&*bf16, "step_bf16e", "integ_bf16e", at::kBFloat16);
          progress.Step(absl::StrFormat("%s %s S=%d bf16-cache steps", which, name, s));
          full(*model, "full_bf16", "bf16-cache ", at::kBFloat16);
        }
      }
    }
  }

  for (Record& r : records) r.device = device.str();
  std::printf("\ndevice: %s\n%-6s %-5s %-9s %4s %-11s %10s %12s %14s\n", device.str().c_str(),
              "config", "model", "image", "S", "method", "images/s", "ms/step", "KV bytes/seq");
  for (const Record& r : records) {
    if (IsStepMethod(r.method)) continue;
    std::printf("%-6s %-5s %-9s %4lld %-11s %10.3f %12.3f %14lld\n", r.model.c_str(),
                r.attention.c_str(), r.image.c_str(), static_cast<long long>(r.streams),
                r.method.c_str(), r.images_per_second, r.step_seconds * 1e3,
                static_cast<long long>(r.kv_bytes_per_sequence));
  }
  auto find = [&](const std::string& model, const std::string& att, int64_t s,
                  const std::string& method, int64_t pos = -1) -> const Record* {
    for (const Record& r : records)
      if (r.model == model && r.attention == att && r.streams == s && r.method == method &&
          r.position == pos)
        return &r;
    return nullptr;
  };
  std::printf("\nStep time against position (ms):\n");
  for (const std::string& which : configs) {
    for (const char* att : {"KARM", "ARM"}) {
      for (int64_t s : streams) {
        for (const StepMethod& m : kStepMethods) {
          std::string line = absl::StrFormat("  %-6s %-5s S=%-3d %s", which, att, s, m.label);
          bool any = false;
          for (const Record& r : records)
            if (r.model == which && r.attention == att && r.streams == s && r.method == m.method) {
              line += absl::StrFormat(" %d:%.2f", r.position, r.step_seconds * 1e3);
              any = true;
            }
          if (any) std::printf("%s\n", line.c_str());
        }
      }
    }
  }
  std::printf("\nRatios (same run):\n");
  for (const std::string& which : configs) {
    for (int64_t s : streams) {
      // numerator model, method; denominator model, method; what the ratio is.
      struct Ratio {
        const char *model, *method, *over_model, *over_method, *label;
      };
      for (const Ratio& q :
           {Ratio{"KARM", "integrated", "ARM", "integrated", "KARM / ARM images/s (integrated)"},
            Ratio{"KARM", "full", "ARM", "full", "KARM / ARM images/s (full run)"},
            Ratio{"KARM", "integ_graph", "KARM", "integrated",
                  "KARM CUDA graph / eager images/s (integrated)"},
            Ratio{"KARM", "integ_graph", "ARM", "integrated",
                  "KARM (CUDA graph) / ARM images/s (integrated)"},
            Ratio{"KARM", "integ_bf16", "KARM", "integ_graph",
                  "KARM bf16 / fp32 cache images/s (graphed)"},
            Ratio{"KARM", "integ_bf16", "ARM", "integrated",
                  "KARM (graphed, bf16 cache) / ARM images/s (integrated)"},
            Ratio{"KARM", "integ_bf16e", "KARM", "integrated",
                  "KARM bf16 / fp32 cache images/s (integrated)"},
            Ratio{"KARM", "integ_bf16e", "ARM", "integrated",
                  "KARM (bf16 cache) / ARM images/s (integrated)"},
            Ratio{"KARM", "full_bf16", "ARM", "full",
                  "KARM (bf16 cache) / ARM images/s (full run)"},
            Ratio{"KARM", "full_bf16", "KARM", "full",
                  "KARM bf16 / fp32 cache images/s (full run)"},
            Ratio{"KARM", "integ_w16", "KARM", "integrated",
                  "KARM bf16 / fp32 weights images/s (integrated)"},
            Ratio{"ARM", "integ_w16", "ARM", "integrated",
                  "ARM bf16 / fp32 weights images/s (integrated)"},
            Ratio{"KARM", "full_w16", "KARM", "full",
                  "KARM bf16 / fp32 weights images/s (full run)"},
            Ratio{"ARM", "full_w16", "ARM", "full", "ARM bf16 / fp32 weights images/s (full run)"},
            Ratio{"KARM", "integ_w16", "ARM", "integ_w16",
                  "KARM / ARM images/s (integrated, bf16 weights)"},
            Ratio{"KARM", "full_w16", "ARM", "full_w16",
                  "KARM / ARM images/s (full run, bf16 weights)"}}) {
        const Record* x = find(which, q.model, s, q.method);
        const Record* y = find(which, q.over_model, s, q.over_method);
        if (x && y)
          std::printf("  %-6s S=%-3lld %s: %.2fx\n", which.c_str(), static_cast<long long>(s),
                      q.label, x->images_per_second / y->images_per_second);
      }
      for (const char* att : {"KARM", "ARM"}) {
        const Record* f = find(which, att, s, "full");
        const Record* i = find(which, att, s, "integrated");
        if (f && i)
          std::printf("  %-6s S=%-3lld %-4s integrated / full images/s: %.3f (method check)\n",
                      which.c_str(), static_cast<long long>(s), att,
                      i->images_per_second / f->images_per_second);
      }
    }
    for (const char* att : {"KARM", "ARM"}) {
      const Record* one = find(which, att, 1, "integrated");
      const Record* many = find(which, att, streams.back(), "integrated");
      if (one && many)
        std::printf("  %-6s %-4s images/s with S=%lld vs S=1: %.2fx\n", which.c_str(), att,
                    static_cast<long long>(streams.back()),
                    many->images_per_second / one->images_per_second);
    }
    // What one decode step must read at its last position: every sequence's whole cache (the
    // ring for KARM, the full prefix for ARM) and the weights once; per second of step time.
    for (const char* att : {"KARM", "ARM"}) {
      for (int64_t s : streams) {
        for (const StepMethod& m : kStepMethods) {
          const Record* last = nullptr;
          for (const Record& r : records)
            if (r.model == which && r.attention == att && r.streams == s && r.method == m.method)
              last = &r;
          if (last == nullptr) continue;
          const std::string weights = std::string(m.method) == "step_w16" ? "w16" : "";
          const double bytes = static_cast<double>(s) * last->kv_bytes_per_sequence +
                               param_bytes[which + att + weights];
          const double bps = bytes / last->step_seconds;
          std::printf("  %-6s %-4s S=%-3lld %sstep at position %lld reads %.1f MB: %.1f GB/s",
                      which.c_str(), att, static_cast<long long>(s), m.label,
                      static_cast<long long>(last->position), bytes / 1e6, bps / 1e9);
          if (copy_bps > 0) {
            std::printf(" (%.0f%% of the %s %.0f GB/s)", 100 * bps / copy_bps,
                        device.is_cuda() ? "device copy's" : "CPU's measured read bandwidth,",
                        copy_bps / 1e9);
          }
          std::printf("\n");
        }
      }
    }
    if (which == "cifar") {
      for (int64_t s : streams) {
        const Record* a = find(which, "KARM", s, "step", 300);
        const Record* b = find(which, "KARM", s, "step", 3000);
        if (a && b)
          std::printf("  cifar  KARM S=%-3lld step time at 3000 / at 300: %.3f\n",
                      static_cast<long long>(s), b->step_seconds / a->step_seconds);
      }
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream js(o.json_path);
    js << "[\n";
    for (size_t i = 0; i < records.size(); ++i)
      js << "  " << ToJson(records[i]) << (i + 1 < records.size() ? ",\n" : "\n");
    js << "]\n";
  }
  return 0;
}

}  // namespace
}  // namespace krause::bench

int main(int argc, char** argv) { return krause::bench::Main(argc, argv); }
