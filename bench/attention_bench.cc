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
// The decode kernel's work item alone, against one core's memory bandwidth, is krause-kernel-bench
// (bench/kernel_bench.cc; it was --items here).
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
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/args.h"
#include "bench/counting_allocator.h"
#include "bench/progress.h"
#include "bench/timing.h"
#include "model/attention/cpu_kernels.h"
#include "model/attention/decode.h"
#include "model/attention/krause_attention.h"
#include "model/util/threads.h"

namespace krause::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string json_path;
  bool quick = false;
  int reps = 5;
  int threads = 0;
  std::string filter;
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
      "  --help         this text\n\n"
      "The decode kernel's item and the linear kernel on one thread: krause-kernel-bench.\n");
}

bool ParseOptions(int argc, char** argv, Options* o) {
  for (ArgWalker args(argc, argv); args.Next();) {
    if (args.Common(PrintHelp, &o->json_path, &o->reps)) continue;
    const std::string a = args.flag();
    if (a == "--quick") {
      o->quick = true;
    } else if (a == "--threads") {
      o->threads = std::atoi(args.Value());
    } else if (a == "--filter") {
      o->filter = args.Value();
    } else if (a == "--items") {
      std::fprintf(stderr, "--items is krause-kernel-bench now\n");
      return false;
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
  const double first = SecondsOf(fn);
  r->peak_extra_bytes = alloc.peak() - before;
  const std::vector<double> times = RunsAfterWarmUp(fn, reps, first);
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

int Main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  krause::SetCpuThreads(threads);
  CountingAllocator::Install();

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
    std::vector<std::string> json;
    for (const Record& r : records) json.push_back(ToJson(r, threads));
    WriteJsonRecords(o.json_path, json);
  }
  return 0;
}

}  // namespace
}  // namespace krause::bench

int main(int argc, char** argv) { return krause::bench::Main(argc, argv); }
