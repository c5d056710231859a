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
//
// This file: the flags and the measurements; the timing in generate_steps.cc, the report in
// generate_report.cc (generate_bench.h).
#include "bench/generate_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
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

struct Options {
  std::string json_path;
  bool quick = false;
  std::string only;  // "mnist" or "cifar"
  std::string device = "cpu";
  std::vector<int64_t> streams;  // empty: {1, 16, 64} ({1, 16} with --quick)
  // --repeat_step CONFIG,ATTENTION,S,POSITION,STEPS: only that decode step, STEPS times.
  std::string repeat_step;
};

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
  PrintReport(records, configs, streams, param_bytes, copy_bps, device);
  if (!o.json_path.empty()) WriteJson(o.json_path, records);
  return 0;
}

}  // namespace
}  // namespace krause::bench

int main(int argc, char** argv) { return krause::bench::Main(argc, argv); }
