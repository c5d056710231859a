// krause-train-bench: settings that decide how fast the bundled models train on a CPU, each
// compared side by side in one run on the bundled Fashion-MNIST sizes (Krause ViT and ViT, d 64,
// 4 layers, patch 4, 7x7 patches + CLS; the KARM generator, d 32, 3 layers, W 56, k 40):
//   "blas threads": LibTorch parallelises its kernels over T intra-op threads and calls OpenBLAS
//       for every matrix product; OpenBLAS by default runs its own pool of one thread per core.
//       A = OpenBLAS at T threads (its default), B = single-threaded BLAS calls (what
//       SetCpuThreads does, model/util/threads.h).
//   "grid route" (Krause ViT): how the windowed training path scores the grid rows
//       (internal::GridRoute): A = gathered candidate table, B = dense rows (kAuto's choice for
//       these sizes); BLAS single-threaded in both.
//   "train impl" (Krause ViT and KARM): which implementation of Krause attention a training
//       step runs: A = the windowed LibTorch path (autograd through its ops), B = the fused CPU
//       forward with its hand-written backward (KrauseImpl::kFusedCpuTrain, kAuto's choice for
//       training on the CPU); BLAS single-threaded in both.
// Workloads: a training step (forward, backward, AdamW) of a batch of 128, and an inference
// forward of a batch of 64 under NoGrad (the fused CPU kernel: the grid route does not apply, so
// that comparison runs the training step only). The KARM's training step: teacher-forced NLL of a
// batch of 32 random images (784 subpixels), backward, AdamW.
// A and B alternate round by round, so slow phases of the machine hit both; each result is the
// median of the rounds.
//   krause-train-bench [--rounds N] [--threads T] [--json PATH]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/args.h"
#include "bench/op_profile.h"
#include "bench/progress.h"
#include "model/attention/krause_attention.h"
#include "model/pixel_model.h"
#include "model/train/optimizer.h"
#include "model/util/threads.h"
#include "model/vit.h"

namespace krause::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int rounds = 7, threads = 0;
  std::string json_path;
  std::string profile;  // a model: print its training step's op profile instead
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
    } else if (a == "--profile") {
      o->profile = args.Value();
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "krause-train-bench [--rounds N (7)] [--threads T (0: one per core)] [--json PATH]\n"
          "                   [--profile krause_vit|vit|karm|arm]\n"
          "Training step and inference throughput of the bundled model sizes: OpenBLAS at\n"
          "T threads vs single-threaded BLAS calls (classifiers), the windowed grid routes\n"
          "(candidate table vs dense rows; Krause ViT training) and the training implementation\n"
          "of Krause attention (windowed autograd vs fused forward + hand-written backward;\n"
          "Krause ViT and KARM training) and of the ARM's causal softmax attention (LibTorch\n"
          "reference vs fused CPU kernel + hand-written backward), A and B alternating round by\n"
          "round.\n"
          "--profile MODEL: instead, 3 training steps of that model with a per-op self-time\n"
          "profile (ATen RecordFunction; forward ops and autograd backward functions).\n");
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

// A model of a bundled size with its own optimizer and a fixed random batch. Not movable: the
// optimizer points at the model's parameters.
struct Workload {
  std::string model;                    // krause_vit | vit | karm | arm
  KrauseImpl impl = KrauseImpl::kAuto;  // of Krause attention in the training step
  std::unique_ptr<ViT> vit;
  std::unique_ptr<PixelModel> pixel;
  std::unique_ptr<AdamW> opt;
  at::Tensor train_x, train_y, infer_x;

  explicit Workload(const std::string& kind) : model(kind) {
    at::manual_seed(3);
    if (kind == "karm" || kind == "arm") {
      pixel = std::make_unique<PixelModel>(MakePixelModel(kind == "karm" ? "krause" : "softmax"));
      opt = std::make_unique<AdamW>(&pixel->parameters(), AdamWOptions{});
      train_x = at::randint(0, 256, {32, 784}, at::kLong);
      return;
    }
    vit = std::make_unique<ViT>(MakeViT(kind == "krause_vit" ? "krause" : "softmax"));
    opt = std::make_unique<AdamW>(&vit->parameters(), AdamWOptions{});
    train_x = at::randn({128, 1, 28, 28});
    train_y = at::randint(0, 10, {128}, at::kLong);
    infer_x = at::randn({64, 1, 28, 28});
  }

  static PixelModel MakePixelModel(const std::string& attention) {
    PixelModelConfig
        c;  // the bundled generators' sizes (models/karm_fmnist.md, models/arm_fmnist.md)
    c.attention = ParseAttentionKind(attention).value();
    c.d_model = 32;
    c.depth = 3;
    c.heads = 2;
    c.window = 56;
    c.top_k = 40;
    return PixelModel::Create(c, 1).value();
  }
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  static ViT MakeViT(const std::string& attention) {
    ViTConfig c;  // the bundled classifiers' sizes (models/*_fmnist.md)
    c.attention = ParseAttentionKind(attention).value();
    c.metric = GridMetric::kChebyshev;
    c.top_k = 3;
    return ViT::Create(c, 1).value();
  }

  // Seconds per image for `reps` training steps.
  double TrainStep(int reps) {
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      const at::Tensor loss = pixel ? pixel->NllPerImage(train_x, impl).mean()
                                    : at::cross_entropy_loss(vit->Forward(train_x, impl), train_y);
      opt->ZeroGrad();
      loss.backward();
      opt->Step(1e-4);
    }
    return std::chrono::duration<double>(Clock::now() - t0).count() / (reps * train_x.size(0));
  }

  double Inference(int reps) {
    at::NoGradGuard no_grad;
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) (void)vit->Forward(infer_x).sum().item<float>();
    return std::chrono::duration<double>(Clock::now() - t0).count() / (reps * infer_x.size(0));
  }
};

struct Result {
  std::string comparison, model, workload, a, b;
  double per_image_a = 0, per_image_b = 0;
};

// One comparison: a name, the two settings' labels and how to apply each.
struct Comparison {
  std::string name, a, b;
  std::function<void(Workload& w, bool use_b)> apply;
  // Empty: the classifiers' training steps and inference; else only these models' training
  // steps.
  std::vector<std::string> only_models;
};

int Main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;
  const CpuThreads setup = SetCpuThreads(o.threads);
  const int t = setup.intra_op;
  if (setup.blas == 0) std::fprintf(stderr, "OpenBLAS is not loaded here: no BLAS comparison\n");
  if (!o.profile.empty()) {
    if (o.profile != "krause_vit" && o.profile != "vit" && o.profile != "karm" &&
        o.profile != "arm") {
      std::fprintf(stderr, "--profile must be krause_vit, vit, karm or arm\n");
      return 2;
    }
    Workload w(o.profile);
    w.TrainStep(1);  // warm-up
    OpProfile p;
    p.Start();
    const double per_image = w.TrainStep(3);
    p.Stop();
    std::printf("%s training step, %d intra-op threads: %.1f images/s while profiled\n",
                o.profile.c_str(), t, 1 / per_image);
    p.Print(30);
    return 0;
  }
  std::vector<std::unique_ptr<Workload>> loads;
  loads.push_back(std::make_unique<Workload>("krause_vit"));
  loads.push_back(std::make_unique<Workload>("vit"));
  loads.push_back(std::make_unique<Workload>("karm"));
  loads.push_back(std::make_unique<Workload>("arm"));
  const std::vector<std::string> kinds = {"train_step", "inference"};
  std::vector<Comparison> comparisons;
  if (setup.blas != 0) {
    comparisons.push_back({"blas threads", absl::StrCat("blas=", t), "blas=1",
                           [t](Workload&, bool use_b) { SetBlasThreads(use_b ? 1 : t); },
                           /*only_models=*/{}});
  }
  comparisons.push_back({"grid route",
                         "table",
                         "dense_rows",
                         [](Workload& w, bool use_b) {
                           SetBlasThreads(1);
                           w.impl = KrauseImpl::kWindowed;
                           internal::SetGridRouteForTesting(
                               use_b ? internal::GridRoute::kDenseRows
                                     : internal::GridRoute::kCandidateTable);
                         },
                         {"krause_vit"}});
  comparisons.push_back({"train impl",
                         "windowed",
                         "fused_train",
                         [](Workload& w, bool use_b) {
                           SetBlasThreads(1);
                           internal::SetGridRouteForTesting(internal::GridRoute::kAuto);
                           w.impl = use_b ? KrauseImpl::kFusedCpuTrain : KrauseImpl::kWindowed;
                         },
                         {"krause_vit", "karm"}});
  comparisons.push_back({"softmax train impl",
                         "reference",
                         "fused_train",
                         [](Workload& w, bool use_b) {
                           SetBlasThreads(1);
                           w.impl = use_b ? KrauseImpl::kFusedCpuTrain : KrauseImpl::kReference;
                         },
                         {"arm"}});

  int total = 0;
  for (const Comparison& c : comparisons)
    total += (c.only_models.empty() ? 2 * static_cast<int>(kinds.size())
                                    : static_cast<int>(c.only_models.size())) *
             o.rounds * 2;
  Progress progress;
  progress.total = total;
  std::vector<Result> results;
  for (const Comparison& c : comparisons) {
    for (const std::unique_ptr<Workload>& load : loads) {
      Workload& w = *load;
      const bool listed =
          std::find(c.only_models.begin(), c.only_models.end(), w.model) != c.only_models.end();
      if (c.only_models.empty() ? w.pixel != nullptr : !listed) continue;
      for (const std::string& kind : kinds) {
        if (!c.only_models.empty() && kind != "train_step") continue;
        auto run = [&] { return kind == "train_step" ? w.TrainStep(3) : w.Inference(5); };
        for (bool use_b : {false, true}) {  // warm-up at each setting
          c.apply(w, use_b);
          run();
        }
        std::vector<double> at_a, at_b;
        for (int r = 0; r < o.rounds; ++r) {
          for (bool use_b : {false, true}) {
            c.apply(w, use_b);
            (use_b ? at_b : at_a).push_back(run());
            progress.Step(
                absl::StrFormat("%s: %s %s %s", c.name, w.model, kind, use_b ? c.b : c.a));
          }
        }
        results.push_back({c.name, w.model, kind, c.a, c.b, Median(at_a), Median(at_b)});
      }
    }
  }
  SetBlasThreads(1);
  internal::SetGridRouteForTesting(internal::GridRoute::kAuto);

  std::printf("%d intra-op threads; median of %d alternating rounds; images/s\n", t, o.rounds);
  std::printf("%-13s %-11s %-11s %-11s %10s %-11s %10s %8s\n", "comparison", "model", "workload",
              "A", "img/s A", "B", "img/s B", "B vs A");
  for (const Result& r : results)
    std::printf("%-13s %-11s %-11s %-11s %10.1f %-11s %10.1f %7.2fx\n", r.comparison.c_str(),
                r.model.c_str(), r.workload.c_str(), r.a.c_str(), 1 / r.per_image_a, r.b.c_str(),
                1 / r.per_image_b, r.per_image_a / r.per_image_b);
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << "[\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      f << absl::StrFormat(
          "  {\"comparison\":\"%s\",\"model\":\"%s\",\"workload\":\"%s\",\"intra_op_threads\":%d,"
          "\"a\":\"%s\",\"images_per_second_a\":%.6g,\"b\":\"%s\",\"images_per_second_b\":%.6g,"
          "\"b_vs_a\":%.4g}%s\n",
          r.comparison, r.model, r.workload, t, r.a, 1 / r.per_image_a, r.b, 1 / r.per_image_b,
          r.per_image_a / r.per_image_b, i + 1 < results.size() ? "," : "");
    }
    f << "]\n";
  }
  return 0;
}

}  // namespace
}  // namespace krause::bench

int main(int argc, char** argv) { return krause::bench::Main(argc, argv); }
