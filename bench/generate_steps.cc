// krause-generate-bench's timing (bench/generate_bench.h): the paper's configs, one decode step's
// median time, the images/s its times integrate to, the device's and the CPU's bandwidth, caches
// of random history, end-to-end engine runs, and --repeat_step.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/generate_bench.h"
#include "model/engine/decode_engine.h"
#include "model/engine/decode_graphs.h"

namespace krause::bench {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

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

double StepSeconds(const StepFn& step, int64_t s, int64_t position, int reps, int warmup) {
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

double IntegratedSeconds(const std::vector<int64_t>& positions, const std::vector<double>& times) {
  double total = 0;
  for (size_t i = 0; i + 1 < positions.size(); ++i) {
    const int64_t span = positions[i + 1] - positions[i];
    total += span * (times[i] + times[i + 1]) / 2;
  }
  return total + times.back();
}

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

double FullRun(const PixelModel& m, int64_t s, at::ScalarType cache_dtype) {
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

}  // namespace krause::bench
