// krause-attention-bench: Krause attention implementations side by side at the same shapes.
//
// Prefill (causal N in {784, 3072} x (W, k) in {(128, 96), (256, 192)} x B in {1, 8}; grids 8x8 and
// 14x14 with radius 1 and 2 plus CLS), H = 8, d = 64, fp32:
//   dense_masked   what the authors' code does: every pair's score by one GEMM (distance form), a
//                  mask built once, top-k, softmax, scatter, matmul. A peer, not the reference:
//                  KrauseImpl::kReference sums each pair's distance by itself (no GEMM, so that
//                  ties follow the tie rule on any BLAS) and is slower for it
//   windowed       device-agnostic LibTorch training path
//   fused_cpu      the fused CPU kernel
//   softmax_dense  plain dense softmax attention: matmul, softmax, matmul (no mask: its cheapest
//   form)
// Decode (S in {1, 16, 64} sequences at positions 300 and 3000, W = 256, k = 192):
//   fused_decode    one step over the ring-buffer caches
//   softmax_prefix  dense softmax of the new token over its whole prefix (preallocated cache)
// --items instead: the decode kernel's work item (one ring of the MNIST config: W 128, k 96,
// d 32) on one thread, its ring in cache or one of 3000 streamed from memory, fp32 and bf16 rings,
// with and without the next item's prefetch hint, on huge or 4 KiB pages; beside one core's
// plain streaming read bandwidth, measured in the same run.
//
// Each figure is the median of several runs after a warm-up (one run when a run takes > 2 s).
// Peak extra memory: bytes LibTorch allocated during the call above what was in use before it.
// Ratios are printed from this one run: compare figures only within one run (noisy machines).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/args.h"
#include "bench/counting_allocator.h"
#include "bench/progress.h"
#include "model/attention/cpu_kernels.h"
#include "model/attention/cpu_scratch.h"
#include "model/attention/decode.h"
#include "model/attention/krause_attention.h"
#include "model/util/huge_pages.h"
#include "model/util/threads.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace krause::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string json_path;
  bool quick = false;
  int reps = 5;
  int threads = 0;
  std::string filter;
  bool items = false;
};

void PrintHelp() {
  std::printf(
      "krause-attention-bench: Krause attention implementations side by side.\n\n"
      "Usage: krause-attention-bench [--quick] [--json FILE] [--reps N] [--threads N]\n"
      "                              [--filter TEXT]\n\n"
      "  --quick        small subset (B = 1, no dense_masked at N = 3072): a smoke run of ~1 min\n"
      "  --json FILE    also write one JSON record per measurement to FILE\n"
      "  --reps N       timed runs per measurement after a warm-up (default 5; median reported)\n"
      "  --threads N    intra-op threads (default: all cores)\n"
      "  --filter TEXT  only configurations whose label contains TEXT\n"
      "  --items        instead: the decode kernel's item on one thread (ring in cache or "
      "streamed,\n"
      "                 fp32/bf16, with/without the prefetch hint, huge/4 KiB pages), ~10 s\n"
      "  --help         this text\n");
}

bool ParseOptions(int argc, char** argv, Options* o) {
  for (ArgWalker args(argc, argv); args.Next();) {
    const std::string a = args.flag();
    if (a == "--help" || a == "-h") {
      PrintHelp();
      std::exit(0);
    } else if (a == "--quick") {
      o->quick = true;
    } else if (a == "--json") {
      o->json_path = args.Value();
    } else if (a == "--reps") {
      o->reps = std::max(1, std::atoi(args.Value()));
    } else if (a == "--threads") {
      o->threads = std::atoi(args.Value());
    } else if (a == "--filter") {
      o->filter = args.Value();
    } else if (a == "--items") {
      o->items = true;
    } else {
      std::fprintf(stderr, "unknown argument %s (see --help)\n", a.c_str());
      return false;
    }
  }
  return true;
}

struct Record {
  std::string op, impl, neighbourhood;
  int64_t n = 0, window = 0, top_k = 0, batch = 0, heads = 0, head_dim = 0;
  int64_t streams = 0, position = -1;
  double seconds = 0;
  int64_t peak_extra_bytes = 0;
  int64_t kv_bytes_per_sequence = 0;
  int runs = 0;
};

std::string ToJson(const Record& r, int threads) {
  std::string s = absl::StrFormat(
      "{\"op\":\"%s\",\"impl\":\"%s\",\"neighbourhood\":\"%s\",\"n\":%d,\"window\":%d,"
      "\"top_k\":%d,\"batch\":%d,\"heads\":%d,\"head_dim\":%d,\"seconds\":%.9g,"
      "\"peak_extra_bytes\":%d,\"runs\":%d,\"threads\":%d",
      r.op, r.impl, r.neighbourhood, r.n, r.window, r.top_k, r.batch, r.heads, r.head_dim,
      r.seconds, r.peak_extra_bytes, r.runs, threads);
  if (r.op == "decode") {
    s += absl::StrFormat(",\"streams\":%d,\"position\":%d,\"kv_bytes_per_sequence\":%d", r.streams,
                         r.position, r.kv_bytes_per_sequence);
  }
  return s + "}";
}

// Runs fn: the first run measures peak memory (and is the only sample if it is slow), then
// `reps` timed runs. Returns the median.
void Measure(const std::function<void()>& fn, int reps, Record* r) {
  CountingAllocator& alloc = CountingAllocator::Install();
  const int64_t before = alloc.in_use();
  alloc.ResetPeak();
  auto t0 = Clock::now();
  fn();
  const double first = std::chrono::duration<double>(Clock::now() - t0).count();
  r->peak_extra_bytes = alloc.peak() - before;
  std::vector<double> times;
  if (first > 2.0 || reps == 0) {
    times.push_back(first);
  } else {
    for (int i = 0; i < reps; ++i) {
      t0 = Clock::now();
      fn();
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  std::sort(times.begin(), times.end());
  r->seconds = times[times.size() / 2];
  r->runs = static_cast<int>(times.size());
}

struct PrefillConfig {
  Neighbourhood nb;
  int64_t n, top_k, batch;
  bool run_dense;
  std::string label() const {
    return absl::StrFormat("prefill %s N=%d k=%d B=%d", nb.ToString(), n, top_k, batch);
  }
};

struct DecodeConfig {
  int64_t streams, window, top_k;
  std::vector<int64_t> positions;  // measured interleaved, so their ratio is side by side
  std::string label() const {
    return absl::StrFormat("decode W=%d k=%d S=%d", window, top_k, streams);
  }
};

constexpr int64_t kHeads = 8, kHeadDim = 64;

void RunPrefill(const PrefillConfig& c, const Options& o, std::vector<Record>* out,
                Progress* progress) {
  at::manual_seed(1);
  const at::Tensor q = at::randn({c.batch, kHeads, c.n, kHeadDim}) * 0.3;
  const at::Tensor k = at::randn({c.batch, kHeads, c.n, kHeadDim}) * 0.3;
  const at::Tensor v = at::randn({c.batch, kHeads, c.n, kHeadDim});
  const at::Tensor ls = at::zeros({kHeads});
  auto krause = [&](KrauseImpl impl) {
    return [&, impl] {
      KrauseOptions opts;
      opts.neighbourhood = c.nb;
      opts.top_k = c.top_k;
      opts.impl = impl;
      auto r = KrauseAttention(q, k, v, ls, opts);
      if (!r.ok()) {
        std::fprintf(stderr, "\n%s\n", r.status().ToString().c_str());
        std::exit(1);
      }
    };
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  std::vector<std::pair<std::string, std::function<void()>>> impls;
  at::Tensor allowed;  // [N, N]: j in N(i); built once, as the authors' modules keep a mask buffer
  if (c.run_dense) {
    allowed = at::zeros({c.n, c.n}, at::kBool);
    auto acc = allowed.accessor<bool, 2>();
    std::vector<int64_t> cand;
    for (int64_t i = 0; i < c.n; ++i) {
      AppendCandidates(c.nb, c.n, i, &cand);
      for (int64_t j : cand) acc[i][j] = true;
    }
    const int64_t kept = std::min(c.top_k, MaxCandidates(c.nb, c.n));
    const at::Tensor two_var = (2.0 * at::exp(2.0 * ls)).view({1, kHeads, 1, 1});
    impls.push_back({"dense_masked", [&, kept, two_var] {
                       const at::Tensor dist2 = (q * q).sum(-1, true) +
                                                (k * k).sum(-1).unsqueeze(-2) -
                                                2.0 * at::matmul(q, k.transpose(-1, -2));
                       const at::Tensor s =
                           (-dist2 / two_var).masked_fill(allowed.logical_not(), -INFINITY);
                       const auto [top, index] = s.topk(kept, -1);
                       const at::Tensor w = at::softmax(top, -1);
                       const at::Tensor o2 = at::matmul(at::zeros_like(s).scatter(-1, index, w), v);
                     }});
  }
  impls.push_back({"windowed", krause(KrauseImpl::kWindowed)});
  impls.push_back({"fused_cpu", krause(KrauseImpl::kFusedCpu)});
  impls.push_back({"softmax_dense", [&] {
                     at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale;
                     at::Tensor o2 = at::matmul(at::softmax(s, -1), v);
                   }});
  for (auto& [name, fn] : impls) {
    Record r;
    r.op = "prefill";
    r.impl = name;
    r.neighbourhood = c.nb.ToString();
    r.n = c.n;
    r.window = c.nb.kind == Neighbourhood::Kind::kCausal ? c.nb.window : MaxCandidates(c.nb, c.n);
    r.top_k = c.top_k;
    r.batch = c.batch;
    r.heads = kHeads;
    r.head_dim = kHeadDim;
    Measure(fn, o.reps, &r);
    out->push_back(r);
    progress->Step(c.label() + " " + name);
  }
}

// The state of one decode measurement: S sequences whose next token is at `position`.
struct DecodeState {
  int64_t position;
  KrauseRingCache cache;
  at::Tensor q, k, v, slots, pos;
  at::Tensor kc, vc;  // softmax baseline: preallocated [S, H, P, d] prefix caches
};

DecodeState MakeDecodeState(const DecodeConfig& c, int64_t position) {
  DecodeState st;
  st.position = position;
  auto cache_or = KrauseRingCache::Create(c.streams, kHeads, kHeadDim, c.window);
  if (!cache_or.ok()) std::exit(1);
  st.cache = std::move(cache_or).value();
  // A full window of random history in every slot (bias consistent with the keys).
  st.cache.keys_t()
      .narrow(3, 0, c.window)
      .copy_(at::randn({c.streams, kHeads, kHeadDim, c.window}) * 0.3);
  st.cache.values().copy_(at::randn(st.cache.values().sizes()));
  st.cache.bias().copy_(-0.5 * st.cache.keys_t().pow(2).sum(2));
  st.q = at::randn({c.streams, kHeads, kHeadDim}) * 0.3;
  st.k = at::randn({c.streams, kHeads, kHeadDim}) * 0.3;
  st.v = at::randn({c.streams, kHeads, kHeadDim});
  st.slots = at::arange(c.streams, at::kLong);
  st.pos = at::full({c.streams}, position, at::kLong);
  st.kc = at::randn({c.streams, kHeads, position + 1, kHeadDim}) * 0.3;
  st.vc = at::randn({c.streams, kHeads, position + 1, kHeadDim});
  return st;
}

void RunDecode(const DecodeConfig& c, const Options& o, std::vector<Record>* out,
               Progress* progress) {
  at::manual_seed(2);
  std::vector<DecodeState> states;
  for (int64_t p : c.positions) states.push_back(MakeDecodeState(c, p));
  const at::Tensor ls = at::zeros({kHeads});
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  auto krause_step = [&](DecodeState& st) {
    auto r = KrauseDecodeStep(st.q, st.k, st.v, ls, c.top_k, st.slots, st.pos, &st.cache);
    if (!r.ok()) std::exit(1);
  };
  // Softmax baseline: write the new key/value at its position, attend over positions 0..p.
  auto softmax_step = [&](DecodeState& st) {
    st.kc.select(2, st.position).copy_(st.k);
    st.vc.select(2, st.position).copy_(st.v);
    at::Tensor s = at::matmul(st.q.unsqueeze(2), st.kc.transpose(-1, -2)) * scale;  // [S,H,1,P]
    at::Tensor o2 = at::matmul(at::softmax(s, -1), st.vc);
  };
  const std::vector<std::pair<std::string, std::function<void(DecodeState&)>>> impls = {
      {"fused_decode", krause_step}, {"softmax_prefix", softmax_step}};
  for (const auto& [name, step] : impls) {
    std::vector<Record> recs(states.size());
    std::vector<std::vector<double>> times(states.size());
    for (size_t i = 0; i < states.size(); ++i) {  // warm-up, measuring peak memory
      Measure([&] { step(states[i]); }, 0, &recs[i]);
    }
    // Interleaved timed runs: at least `reps`, and at least 0.3 s in all.
    const auto start = Clock::now();
    for (int rep = 0; rep < std::max(o.reps, 30) ||
                      std::chrono::duration<double>(Clock::now() - start).count() < 0.3;
         ++rep) {
      for (size_t i = 0; i < states.size(); ++i) {
        const auto t0 = Clock::now();
        step(states[i]);
        times[i].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    for (size_t i = 0; i < states.size(); ++i) {
      Record& r = recs[i];
      std::sort(times[i].begin(), times[i].end());
      r.seconds = times[i][times[i].size() / 2];
      r.runs = static_cast<int>(times[i].size());
      const int64_t visible = states[i].position + 1;
      r.op = "decode";
      r.impl = name;
      const bool krause = name == "fused_decode";
      r.neighbourhood =
          krause ? Neighbourhood::Causal(c.window).ToString() : std::string("causal(full prefix)");
      r.n = visible;
      r.window = krause ? c.window : visible;
      r.top_k = krause ? c.top_k : visible;
      r.batch = c.streams;
      r.streams = c.streams;
      r.position = states[i].position;
      r.heads = kHeads;
      r.head_dim = kHeadDim;
      r.kv_bytes_per_sequence =
          krause ? states[i].cache.bytes_per_slot() : visible * kHeads * kHeadDim * 2 * int64_t{4};
      out->push_back(r);
    }
    progress->Step(c.label() + " " + name);
  }
}

const Record* Find(const std::vector<Record>& rs, const std::string& label_impl,
                   const std::function<bool(const Record&)>& same) {
  for (const Record& r : rs)
    if (r.impl == label_impl && same(r)) return &r;
  return nullptr;
}

constexpr int64_t kW = 128, kK = 96, kD = 32, kPosition = 700;  // the MNIST config's rings

// Seconds of one call of fn: Measure's median (a warm-up call, then `reps` timed ones).
double MedianSeconds(const std::function<void()>& fn, int reps) {
  Record r;
  Measure(fn, reps, &r);
  return r.seconds;
}

// --items: one decode item at a time on this thread, over `rings` rings of the MNIST config (the
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

int RunItems(const Options& o) {
  krause::SetCpuThreads(1);
  std::fprintf(stderr, "krause-attention-bench --items: CPU kernels %s, one thread\n",
               cpu::CpuKernels().name);
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
  if (!o.json_path.empty()) {
    std::ofstream js(o.json_path);
    js << "[\n";
    for (size_t i = 0; i < json.size(); ++i)
      js << "  " << json[i] << (i + 1 < json.size() ? ",\n" : "\n");
    js << "]\n";
    std::printf("\nwrote %zu records to %s\n", json.size(), o.json_path.c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  krause::SetCpuThreads(threads);
  CountingAllocator::Install();
  if (o.items) return RunItems(o);  // sets its own single thread

  std::vector<PrefillConfig> prefill;
  for (int64_t n : {784, 3072}) {
    for (auto [w, k] : {std::pair<int64_t, int64_t>{128, 96}, {256, 192}}) {
      for (int64_t b : {1, 8}) {
        if (o.quick && b != 1) continue;
        prefill.push_back({Neighbourhood::Causal(w), n, k, b, !(o.quick && n == 3072)});
      }
    }
  }
  for (int64_t side : {8, 14}) {
    prefill.push_back({Neighbourhood::Grid(side, side, 1, GridMetric::kManhattan, true),
                       side * side + 1, 4, 8, true});
    prefill.push_back({Neighbourhood::Grid(side, side, 2, GridMetric::kChebyshev, true),
                       side * side + 1, 16, 8, true});
  }
  std::vector<DecodeConfig> decode;
  for (int64_t s : {1, 16, 64}) {
    if (o.quick && s == 16) continue;
    decode.push_back({s, 256, 192, {300, 3000}});
  }
  auto keep = [&](const std::string& label) {
    return o.filter.empty() || label.find(o.filter) != std::string::npos;
  };
  Progress progress;
  for (auto& c : prefill)
    if (keep(c.label())) progress.total += c.run_dense ? 4 : 3;
  for (auto& c : decode)
    if (keep(c.label())) progress.total += 2;

  std::fprintf(stderr, "krause-attention-bench: %d measurements, %d threads, CPU kernels: %s\n",
               progress.total, threads, cpu::CpuKernels().name);
  std::vector<Record> records;
  for (auto& c : prefill)
    if (keep(c.label())) RunPrefill(c, o, &records, &progress);
  for (auto& c : decode)
    if (keep(c.label())) RunDecode(c, o, &records, &progress);

  // The table.
  std::printf("\n%-8s %-15s %-32s %5s %4s %4s %3s %10s %12s\n", "op", "impl", "neighbourhood", "N",
              "k", "B/S", "pos", "ms", "peak MiB");
  for (const Record& r : records) {
    std::printf("%-8s %-15s %-32s %5lld %4lld %4lld %4s %10.3f %12.2f\n", r.op.c_str(),
                r.impl.c_str(), r.neighbourhood.c_str(), static_cast<long long>(r.n),
                static_cast<long long>(r.top_k), static_cast<long long>(r.batch),
                r.position >= 0 ? std::to_string(r.position).c_str() : "-", r.seconds * 1e3,
                r.peak_extra_bytes / 1048576.0);
  }
  // Ratios from this run.
  std::printf("\nSpeedups of fused_cpu (same run, same shapes):\n");
  for (const Record& f : records) {
    if (f.impl != "fused_cpu") continue;
    auto same = [&](const Record& r) {
      return r.op == f.op && r.neighbourhood == f.neighbourhood && r.n == f.n && r.batch == f.batch;
    };
    std::string line = absl::StrFormat("  %-32s N=%-5d B=%d:", f.neighbourhood, f.n, f.batch);
    for (const char* other : {"dense_masked", "windowed", "softmax_dense"}) {
      if (const Record* r = Find(records, other, same)) {
        line += absl::StrFormat("  vs %s %.1fx", other, r->seconds / f.seconds);
      }
    }
    std::printf("%s\n", line.c_str());
  }
  std::printf("\nDecode step time, position 3000 vs 300 (1.00 = flat):\n");
  for (const Record& r : records) {
    if (r.op != "decode" || r.position != 3000) continue;
    auto same = [&](const Record& x) {
      return x.op == "decode" && x.streams == r.streams && x.position == 300;
    };
    if (const Record* early = Find(records, r.impl, same)) {
      std::printf("  %-15s S=%-3lld  %.3f ms -> %.3f ms  ratio %.2f\n", r.impl.c_str(),
                  static_cast<long long>(r.streams), early->seconds * 1e3, r.seconds * 1e3,
                  r.seconds / early->seconds);
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream js(o.json_path);
    js << "[\n";
    for (size_t i = 0; i < records.size(); ++i) {
      js << "  " << ToJson(records[i], threads) << (i + 1 < records.size() ? ",\n" : "\n");
    }
    js << "]\n";
    std::printf("\nwrote %zu records to %s\n", records.size(), o.json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace krause::bench

int main(int argc, char** argv) { return krause::bench::Main(argc, argv); }
