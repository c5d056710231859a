// krause-threads-bench: how the BLAS library's own threads interact with LibTorch's intra-op pool.
//
// LibTorch parallelises its kernels over T intra-op threads and calls OpenBLAS for every matrix
// product; OpenBLAS by default runs its own pool of one thread per core. The benchmark measures,
// side by side in one run, the bundled Fashion-MNIST classifiers (Krause ViT and ViT, d 64,
// 4 layers, patch 4) at two settings:
//   "blas=T": OpenBLAS with T threads (its default on a T-core machine),
//   "blas=1": single-threaded BLAS calls (what SetCpuThreads does, model/util/threads.h),
// for two workloads: a training step (forward, backward, AdamW) of a batch of 128, and an
// inference forward of a batch of 64 under NoGrad. The settings alternate round by round, so
// slow phases of the machine hit both; each result is the median of the rounds.
//   krause-threads-bench [--rounds N] [--threads T] [--json PATH]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/args.h"
#include "bench/progress.h"
#include "model/train/optimizer.h"
#include "model/util/threads.h"
#include "model/vit.h"

namespace krause::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int rounds = 7, threads = 0;
  std::string json_path;
};

bool ParseOptions(int argc, char** argv, Options* o) {
  for (ArgWalker args(argc, argv); args.Next();) {
    const std::string a = args.flag();
    if (a == "--rounds") {
      o->rounds = std::max(1, std::atoi(args.Value()));
    } else if (a == "--threads") {
      o->threads = std::atoi(args.Value());
    } else if (a == "--json") {
      o->json_path = args.Value();
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "krause-threads-bench [--rounds N (7)] [--threads T (0: one per core)] [--json PATH]\n"
          "Training step and inference throughput of the bundled classifier sizes with OpenBLAS\n"
          "at T threads vs single-threaded BLAS calls, alternating round by round.\n");
      std::exit(0);
    } else {
      std::fprintf(stderr, "unknown argument %s (see --help)\n", a.c_str());
      return false;
    }
  }
  return true;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A ViT of the bundled classifiers' size with its own optimizer and a fixed random batch. Not
// movable: the optimizer points at the model's parameters.
struct Workload {
  std::string model;  // krause_vit | vit
  ViT vit;
  AdamW opt;
  at::Tensor train_x, train_y, infer_x;

  explicit Workload(const std::string& attention)
      : model(attention == "krause" ? "krause_vit" : "vit"),
        vit(MakeViT(attention)),
        opt(&vit.parameters(), AdamWOptions{}) {
    at::manual_seed(3);
    train_x = at::randn({128, 1, 28, 28});
    train_y = at::randint(0, 10, {128}, at::kLong);
    infer_x = at::randn({64, 1, 28, 28});
  }
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  static ViT MakeViT(const std::string& attention) {
    ViTConfig c;  // the bundled classifiers' sizes (models/*_fmnist.md)
    c.attention = attention;
    c.metric = GridMetric::kChebyshev;
    c.top_k = 3;
    return ViT::Create(c, 1).value();
  }

  // Seconds per image for `reps` training steps.
  double TrainStep(int reps) {
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      const at::Tensor loss = at::cross_entropy_loss(vit.Forward(train_x), train_y);
      opt.ZeroGrad();
      loss.backward();
      opt.Step(1e-4);
    }
    return std::chrono::duration<double>(Clock::now() - t0).count() / (reps * train_x.size(0));
  }

  double Inference(int reps) {
    at::NoGradGuard no_grad;
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) (void)vit.Forward(infer_x).sum().item<float>();
    return std::chrono::duration<double>(Clock::now() - t0).count() / (reps * infer_x.size(0));
  }
};

struct Result {
  std::string model, workload;
  double per_image_blas_t = 0, per_image_blas_1 = 0;
};

int Main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;
  const CpuThreads setup = SetCpuThreads(o.threads);
  const int t = setup.intra_op;
  if (setup.blas == 0) {
    std::fprintf(stderr, "OpenBLAS is not loaded here: nothing to compare\n");
    return 1;
  }
  std::vector<std::unique_ptr<Workload>> loads;
  loads.push_back(std::make_unique<Workload>("krause"));
  loads.push_back(std::make_unique<Workload>("softmax"));
  const std::vector<std::string> kinds = {"train_step", "inference"};

  std::vector<Result> results;
  Progress progress;
  progress.total = static_cast<int>(loads.size() * kinds.size()) * o.rounds * 2;
  for (const std::unique_ptr<Workload>& load : loads) {
    Workload& w = *load;
    for (const std::string& kind : kinds) {
      auto run = [&] { return kind == "train_step" ? w.TrainStep(3) : w.Inference(5); };
      SetBlasThreads(t);
      run();  // warm-up at each setting
      SetBlasThreads(1);
      run();
      std::vector<double> at_t, at_1;
      for (int r = 0; r < o.rounds; ++r) {
        SetBlasThreads(t);
        at_t.push_back(run());
        progress.Step(absl::StrFormat("%s %s blas=%d", w.model, kind, t));
        SetBlasThreads(1);
        at_1.push_back(run());
        progress.Step(absl::StrFormat("%s %s blas=1", w.model, kind));
      }
      results.push_back({w.model, kind, Median(at_t), Median(at_1)});
    }
  }
  SetBlasThreads(1);

  std::printf("%d intra-op threads; OpenBLAS at %d threads vs 1; median of %d alternating rounds\n",
              t, t, o.rounds);
  std::printf("%-11s %-11s %14s %14s %9s\n", "model", "workload", "img/s blas=T", "img/s blas=1",
              "1 vs T");
  for (const Result& r : results)
    std::printf("%-11s %-11s %14.1f %14.1f %8.2fx\n", r.model.c_str(), r.workload.c_str(),
                1 / r.per_image_blas_t, 1 / r.per_image_blas_1,
                r.per_image_blas_t / r.per_image_blas_1);
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << "[\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      f << absl::StrFormat(
          "  {\"model\":\"%s\",\"workload\":\"%s\",\"intra_op_threads\":%d,"
          "\"images_per_second_blas_t\":%.6g,\"images_per_second_blas_1\":%.6g,\"speedup\":%.4g}%s\n",
          r.model, r.workload, t, 1 / r.per_image_blas_t, 1 / r.per_image_blas_1,
          r.per_image_blas_t / r.per_image_blas_1, i + 1 < results.size() ? "," : "");
    }
    f << "]\n";
  }
  return 0;
}

}  // namespace
}  // namespace krause::bench

int main(int argc, char** argv) { return krause::bench::Main(argc, argv); }
