// krause-kernel-bench: the CPU kernels' work on one thread against what one core can do. The
// decode kernel's work item (one ring of the MNIST config: W 128, k 96, d 32) with its ring in
// cache or one of 3000 streamed from memory, fp32 and bf16 rings, with and without the next
// item's prefetch hint, on huge or 4 KiB pages, beside one core's plain streaming read bandwidth;
// then the decode step's linear kernel at 64 rows in each kernel variant, fp32 and bf16 weights,
// beside one core's multiply-add throughput. All measured in the same run, in about a minute
// (docs/benchmarks.md, "The decode item's memory"). It was krause-attention-bench --items; it has
// a binary of its own because it measures the kernels and the machine, not attention's
// implementations side by side.
//
// Each figure is the median of several runs after a warm-up (one run when a run takes > 2 s).
// Ratios are printed from this one run: compare figures only within one run (noisy machines).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/args.h"
#include "bench/progress.h"
#include "bench/timing.h"
#include "model/attention/cpu_kernels.h"
#include "model/attention/cpu_scratch.h"
#include "model/util/huge_pages.h"
#include "model/util/threads.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace krause::bench {
namespace {

struct Options {
  std::string json_path;
  int reps = 5;
};

void PrintHelp() {
  std::printf(
      "krause-kernel-bench: the decode kernel's item and the step's linear kernel on one thread,\n"
      "beside one core's read bandwidth and multiply-add throughput.\n\n"
      "Usage: krause-kernel-bench [--json FILE] [--reps N]\n\n"
      "  Rows: the decode item with its ring in cache or streamed, fp32/bf16, with/without the\n"
      "  prefetch hint, huge/4 KiB pages; the linear kernel in each variant, fp32/bf16 weights.\n"
      "  About a minute.\n\n"
      "  --json FILE    also write one JSON record per measurement to FILE\n"
      "  --reps N       timed runs per measurement after a warm-up (default 5, at least 3;\n"
      "                 median reported)\n"
      "  --help         this text\n");
}

bool ParseOptions(int argc, char** argv, Options* o) {
  for (ArgWalker args(argc, argv); args.Next();) {
    if (!args.Common(PrintHelp, &o->json_path, &o->reps)) {
      std::fprintf(stderr, "unknown argument %s (see --help)\n", args.flag().c_str());
      return false;
    }
  }
  return true;
}

constexpr int64_t kW = 128, kK = 96, kD = 32, kPosition = 700;  // the MNIST config's rings

// Seconds of one call of fn: a warm-up call (the only sample when it takes over 2 s), then `reps`
// timed calls; their median.
double MedianSeconds(const std::function<void()>& fn, int reps) {
  const std::vector<double> times = RunsAfterWarmUp(fn, reps, SecondsOf(fn));
  return times[times.size() / 2];
}

// One decode item at a time on this thread, over `rings` rings of the MNIST config (the
// next one's ring as the prefetch hint where `hint`), keys and values of `dtype`, storage
// advised for huge pages or kept on 4 KiB pages. Microseconds per item (MedianSeconds).
double ItemMicros(int64_t rings, at::ScalarType dtype, bool hint, bool huge, int reps) {
  const int64_t stride = cpu::RoundUpToChunk(kW);
  const auto opts = at::TensorOptions().dtype(dtype);
  auto storage = [&](at::IntArrayRef sizes, const at::TensorOptions& o) {
    if (huge) return ZerosOnHugePages(sizes, o);
    at::Tensor t = at::empty(sizes, o);
#if defined(__linux__) && defined(MADV_NOHUGEPAGE)
    constexpr uintptr_t kPage = 4096;
    const uintptr_t a = (reinterpret_cast<uintptr_t>(t.data_ptr()) + kPage - 1) & ~(kPage - 1);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(t.data_ptr()) + t.nbytes()) & ~(kPage - 1);
    if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_NOHUGEPAGE);
#endif
    return t.zero_();
  };
  at::Tensor keys_t = storage({rings, kD, stride}, opts);
  at::Tensor values = storage({rings, kW, kD}, opts);
  at::Tensor bias = storage({rings, stride}, opts.dtype(at::kFloat));
  keys_t.normal_();
  values.normal_();
  bias.normal_();
  const at::Tensor qkv = at::randn({3, kD});
  at::Tensor out = at::zeros({kD});
  const cpu::ScratchTensors scratch(kW);
  const cpu::Scratch& w = scratch.view();
  const int64_t elem = keys_t.element_size();
  auto item_of = [&](int64_t r) {
    cpu::DecodeItem it{};
    it.q = qkv.data_ptr<float>();
    it.k = it.q + kD;
    it.v = it.q + 2 * kD;
    it.ring_kt = static_cast<char*>(keys_t.data_ptr()) + r * kD * stride * elem;
    it.ring_v = static_cast<char*>(values.data_ptr()) + r * kW * kD * elem;
    it.ring_bias = bias.data_ptr<float>() + r * stride;
    it.elem = dtype == at::kBFloat16 ? cpu::Elem::kBFloat16 : cpu::Elem::kFloat32;
    it.position = kPosition;
    it.window = kW;
    it.ring_stride = stride;
    it.d = kD;
    it.top_k = kK;
    it.inv_var = 0.05f;
    it.out = out.data_ptr<float>();
    return it;
  };
  std::vector<cpu::DecodeItem> items;
  for (int64_t r = 0; r < rings; ++r) items.push_back(item_of(r));
  if (hint && rings > 1) {
    for (int64_t r = 0; r < rings; ++r) {
      const cpu::DecodeItem& next = items[(r + 1) % rings];
      items[r].next_kt = next.ring_kt;
      items[r].next_v = next.ring_v;
      items[r].next_bias = next.ring_bias;
    }
  }
  const cpu::CpuKernelTable& kernels = cpu::CpuKernels();
  const int64_t calls = std::max<int64_t>(rings, 20000);  // whole passes over the rings
  const double seconds = MedianSeconds(
      [&] {
        for (int64_t i = 0; i < calls; ++i) kernels.decode(items[i % rings], w);
      },
      reps);
  return seconds / calls * 1e6;
}

// One core reading `bytes` in order (32 independent sums), GB/s (MedianSeconds).
double OneCoreReadGBps(int64_t bytes, int reps) {
  const at::Tensor a = at::ones({bytes / 4});
  const float* p = a.data_ptr<float>();
  const int64_t n = a.numel() / 32 * 32;
  float keep = 0;
  const double seconds = MedianSeconds(
      [&] {
        float s[32] = {};
        for (int64_t i = 0; i < n; i += 32)
          for (int j = 0; j < 32; ++j) s[j] += p[i + j];
        for (float x : s) keep += x;
      },
      reps);
  if (keep < 0) std::printf("%g\n", keep);  // never: keeps the sums
  return n * 4.0 / seconds / 1e9;
}

// One core's fp32 multiply-add throughput, GFLOP/s: twelve independent chains of eight-lane
// multiply-adds (more than the latency times the issue rate, so the units stay busy)
// (MedianSeconds). AVX2 + FMA code where the CPU has it (what the avx2 kernels use); 0 elsewhere.
#if defined(__x86_64__)
constexpr int64_t kFmaIters = int64_t{20} << 20;
__attribute__((target("avx2,fma"), noinline)) float FmaChains() {
  typedef float V8 __attribute__((vector_size(32)));
  // Distinct starting values (equal chains would be computed once).
  V8 a0 = V8{} + 0.0f, a1 = V8{} + 0.1f, a2 = V8{} + 0.2f, a3 = V8{} + 0.3f, a4 = V8{} + 0.4f,
     a5 = V8{} + 0.5f, a6 = V8{} + 0.6f, a7 = V8{} + 0.7f, a8 = V8{} + 0.8f, a9 = V8{} + 0.9f,
     a10 = V8{} + 1.0f, a11 = V8{} + 1.1f;
  V8 b = V8{} + 0.999f, c = V8{} + 1e-4f;
  __asm__ volatile("" : "+x"(b), "+x"(c));  // not constants the compiler could fold
  for (int64_t i = 0; i < kFmaIters; ++i) {
    a0 = a0 * b + c, a1 = a1 * b + c, a2 = a2 * b + c, a3 = a3 * b + c;
    a4 = a4 * b + c, a5 = a5 * b + c, a6 = a6 * b + c, a7 = a7 * b + c;
    a8 = a8 * b + c, a9 = a9 * b + c, a10 = a10 * b + c, a11 = a11 * b + c;
  }
  const V8 sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  return sum[0];
}
#endif

double OneCoreFmaGflops(int reps) {
#if defined(__x86_64__)
  if (std::string(cpu::CpuKernels().name) != "avx2") return 0;
  float keep = 0;
  const double seconds = MedianSeconds([&] { keep += FmaChains(); }, reps);
  if (keep < 0) std::printf("%g\n", keep);  // never: keeps the chains
  return 12.0 * 16.0 * kFmaIters / seconds / 1e9;
#else
  (void)reps;
  return 0;
#endif
}

// The decode step's batch-invariant linear kernel on one thread: `m` rows through an in x out
// layer (cpu::LinearRowsArgs) with weights of `elem`, GFLOP/s (MedianSeconds), in the kernel
// variant in force (cpu::SetCpuKernelsForTesting).
double LinearGflops(int64_t m, int64_t in, int64_t out, cpu::Elem elem, int reps) {
  const at::Tensor x = at::randn({m, in});
  // Chunk blocks: any values do.
  const at::Tensor wt =
      at::randn({out * in}).to(elem == cpu::Elem::kBFloat16 ? at::kBFloat16 : at::kFloat);
  const at::Tensor bias = at::zeros({out});
  at::Tensor y = at::empty({m, out});
  const cpu::LinearRowsArgs a{x.data_ptr<float>(),
                              wt.data_ptr(),
                              bias.data_ptr<float>(),
                              y.data_ptr<float>(),
                              m,
                              in,
                              out,
                              elem};
  const cpu::CpuKernelTable& kernels = cpu::CpuKernels();
  const int64_t calls = std::max<int64_t>(1, static_cast<int64_t>(2e9 / (2.0 * m * in * out)));
  const double seconds = MedianSeconds(
      [&] {
        for (int64_t i = 0; i < calls; ++i) kernels.linear_rows(a, 0, out / cpu::kScoreChunk);
      },
      reps);
  return 2.0 * m * in * out * calls / seconds / 1e9;
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;
  krause::SetCpuThreads(1);
  std::fprintf(stderr, "krause-kernel-bench: CPU kernels %s, one thread\n", cpu::CpuKernels().name);
  struct Row {
    const char* label;
    int64_t rings;
    at::ScalarType dtype;
    bool hint, huge;
  };
  constexpr int64_t kStreamed = 3000;  // 96 MB of fp32 rings: far beyond the caches
  const std::vector<Row> rows = {
      {"in cache", 1, at::kFloat, false, true},
      {"in cache", 1, at::kBFloat16, false, true},
      {"streamed, no hint, 4 KiB pages", kStreamed, at::kFloat, false, false},
      {"streamed, hint, 4 KiB pages", kStreamed, at::kFloat, true, false},
      {"streamed, hint, huge pages", kStreamed, at::kFloat, true, true},
      {"streamed, no hint, 4 KiB pages", kStreamed, at::kBFloat16, false, false},
      {"streamed, hint, 4 KiB pages", kStreamed, at::kBFloat16, true, false},
      {"streamed, hint, huge pages", kStreamed, at::kBFloat16, true, true},
  };
  Progress progress;
  progress.total = static_cast<int>(rows.size()) + 2;
  const int reps = std::max(3, o.reps);
  const double read_gbps = OneCoreReadGBps(int64_t{256} << 20, reps);
  progress.Step("one core's read bandwidth");
  std::vector<std::string> json;
  std::printf(
      "\nDecode item of the MNIST config (W %lld, k %lld, d %lld, position %lld), one thread:\n",
      static_cast<long long>(kW), static_cast<long long>(kK), static_cast<long long>(kD),
      static_cast<long long>(kPosition));
  std::printf("  one core reading 256 MB in order: %.1f GB/s\n", read_gbps);
  std::printf("  %-6s %-32s %10s %10s %14s\n", "ring", "memory", "us/item", "GB/s", "of one core");
  for (const Row& r : rows) {
    const double us = ItemMicros(r.rings, r.dtype, r.hint, r.huge, reps);
    const int64_t elem = r.dtype == at::kBFloat16 ? 2 : 4;
    const double ring_bytes = 2.0 * kW * kD * elem + kW * 4;  // keys, values, biases
    const double gbps = ring_bytes / (us * 1e-6) / 1e9;
    const char* dtype = r.dtype == at::kBFloat16 ? "bf16" : "fp32";
    if (r.rings > 1) {
      std::printf("  %-6s %-32s %10.3f %10.1f %13.0f%%\n", dtype, r.label, us, gbps,
                  100.0 * gbps / read_gbps);
    } else {  // nothing comes from memory
      std::printf("  %-6s %-32s %10.3f %10s %14s\n", dtype, r.label, us, "-", "-");
    }
    json.push_back(absl::StrFormat(
        "{\"op\":\"decode_item\",\"ring\":\"%s\",\"rings\":%d,\"hint\":%s,\"huge_pages\":%s,"
        "\"micros_per_item\":%.6g,\"ring_gbps\":%.6g,\"one_core_read_gbps\":%.6g}",
        dtype, r.rings, r.hint ? "true" : "false", r.huge ? "true" : "false", us, gbps, read_gbps));
    progress.Step(absl::StrFormat("%s %s", dtype, r.label));
  }
  // The step's linears beside them: MNIST's layers at 64 rows, against this core's multiply-add
  // throughput.
  const double peak = OneCoreFmaGflops(reps);
  std::printf(
      "\nThe step's linear kernel at 64 rows (MNIST's layers), one thread, each kernel variant\n"
      "with fp32 and bf16 weights (GFLOP/s):\n");
  if (peak > 0) std::printf("  one core's multiply-adds (AVX2 FMA chains): %.1f GFLOP/s\n", peak);
  for (int v = 0; v < cpu::NumCpuKernelVariants(); ++v) {
    const char* variant = cpu::CpuKernelVariantName(v);
    if (!cpu::SetCpuKernelsForTesting(variant)) continue;
    for (auto [in, out, name] : {std::tuple<int64_t, int64_t, const char*>{256, 768, "qkv"},
                                 {256, 256, "out"},
                                 {256, 1024, "mlp0"},
                                 {1024, 256, "mlp2"}}) {
      const double g = LinearGflops(64, in, out, cpu::Elem::kFloat32, reps);
      const double g16 = LinearGflops(64, in, out, cpu::Elem::kBFloat16, reps);
      std::printf("  %-5s %-5s %4lld x %-5lld fp32 %7.1f, bf16 %7.1f (%.2fx)", variant, name,
                  static_cast<long long>(in), static_cast<long long>(out), g, g16, g16 / g);
      if (peak > 0) std::printf("  fp32 %3.0f%% of the chains", 100.0 * g / peak);
      std::printf("\n");
      for (auto [weights, gflops] : {std::pair{"float32", g}, {"bfloat16", g16}}) {
        json.push_back(absl::StrFormat(
            "{\"op\":\"linear\",\"kernels\":\"%s\",\"weights\":\"%s\",\"layer\":\"%s\","
            "\"rows\":64,\"in\":%d,\"out\":%d,\"gflops\":%.6g,\"one_core_fma_gflops\":%.6g}",
            variant, weights, name, in, out, gflops, peak));
      }
    }
  }
  cpu::SetCpuKernelsForTesting(nullptr);
  progress.Step("the step's linears");
  if (!o.json_path.empty()) WriteJsonRecords(o.json_path, json);
  return 0;
}

}  // namespace
}  // namespace krause::bench

int main(int argc, char** argv) { return krause::bench::Main(argc, argv); }
