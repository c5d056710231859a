// krause-eval: sample quality and likelihood of a generator checkpoint. See --help.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/data/datasets.h"
#include "model/data/png.h"
#include "model/engine/decode_engine.h"
#include "model/eval/sample_quality.h"
#include "model/loader.h"
#include "model/nn/dnnl_linear.h"
#include "model/util/help.h"
#include "model/util/threads.h"

ABSL_FLAG(std::string, generator, "",
          "generator checkpoint (required), e.g. models/karm_fmnist.safetensors");
ABSL_FLAG(std::string, classifier, "models/krause_vit_fmnist.safetensors",
          "classifier whose features and probabilities judge the samples");
ABSL_FLAG(std::string, data, "fashion-mnist", "test data: fashion-mnist | mnist | cifar10");
ABSL_FLAG(std::string, data_dir, "",
          "data set folder (default for fashion-mnist: the Debian package's)");
ABSL_FLAG(int64_t, samples, 1000,
          "images to sample; a conditional model draws class i % classes for image i");
ABSL_FLAG(bool, unconditional, false, "a conditional model samples without a class");
ABSL_FLAG(uint64_t, seed, 1, "image i is sampled with seed + i");
ABSL_FLAG(double, temperature, 1.0, "sampling temperature");
ABSL_FLAG(double, top_p, 1.0,
          "nucleus sampling: keep the most likely values up to this mass (1: off)");
ABSL_FLAG(int32_t, top_k, 0, "keep the k most likely values (0: off)");
ABSL_FLAG(double, guidance, 1.0,
          "conditional models: classifier-free guidance scale (1: off; other values run each "
          "image twice per decode step)");
ABSL_FLAG(int64_t, columns, 10, "images per row of the grid (per class for conditional models)");
ABSL_FLAG(bool, bits_per_dim, true, "also score the whole test set (teacher-forced bits/dim)");
ABSL_FLAG(int64_t, test_limit, 0, "score only the first N test images (0: all)");
ABSL_FLAG(std::string, out, "eval-out", "output folder: grid.png, report.json");
ABSL_FLAG(int, threads, 0, "intra-op threads (0: all cores)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, weights_dtype, "float32",
          "the generator's linear weights: float32, or bfloat16 (rounded at load, as a model "
          "served with \"weights_dtype\": \"bfloat16\"); the judge stays float32");
ABSL_FLAG(std::string, precision, "fp32",
          "the generator's arithmetic on the CPU, as a model served with \"precision\": fp32, "
          "or bf16 (oneDNN bf16 GEMMs in sampling and bits/dim; rounds the weights to bfloat16; "
          "fp32 where the CPU has no AMX, and the report says so)");

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One progress line on stderr with the rate and an ETA.
void Progress(const char* what, int64_t done, int64_t total, Clock::time_point start) {
  const double el = Since(start), rate = done / std::max(el, 1e-9);
  const int bar = static_cast<int>(24.0 * done / std::max<int64_t>(total, 1));
  std::fprintf(stderr, "\r%s [%s%s] %lld/%lld %.1f/s eta %.0fs   ", what,
               std::string(bar, '#').c_str(), std::string(24 - bar, '.').c_str(),
               static_cast<long long>(done), static_cast<long long>(total), rate,
               rate > 0 ? (total - done) / rate : 0.0);
  if (done == total) std::fprintf(stderr, "\n");
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "krause-eval: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  krause::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "sample quality and bits/dim of a generator checkpoint, judged by a classifier.\n"
      "  krause-eval --generator models/karm_fmnist.safetensors --samples 1000\n"
      "Prints and writes OUT/report.json: the Frechet distance between the classifier's features\n"
      "(the head's input) of the samples and of as many real test images, beside the same\n"
      "distance between two disjoint sets of real test images (the floor); the classifier's mean\n"
      "top-1 probability on samples and on real images; for a conditional model the share of\n"
      "samples the classifier assigns to the requested class, per class and averaged; and the\n"
      "bits/dim of the whole test set (conditional models: given each image's class, and\n"
      "without). Writes OUT/grid.png (a conditional model: one row per class).");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument ", rest[1], " (see --help)"));
  const std::string gen_path = absl::GetFlag(FLAGS_generator);
  if (gen_path.empty()) return Fail("--generator is required (see --help)");
  const int64_t count = absl::GetFlag(FLAGS_samples);
  const int64_t columns = absl::GetFlag(FLAGS_columns);
  if (count < 2) return Fail("--samples must be >= 2");
  if (columns < 1) return Fail("--columns must be >= 1");
  krause::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string out_dir = absl::GetFlag(FLAGS_out);

  std::string weights = absl::GetFlag(FLAGS_weights_dtype);
  const auto precision = krause::ParsePrecision(absl::GetFlag(FLAGS_precision), "--precision");
  if (!precision.ok()) return Fail(std::string(precision.status().message()));
  if (*precision == krause::Precision::kBf16) {
    if (weights != "bfloat16" && weights != "float32")
      return Fail("--precision bf16 rounds the weights to bfloat16");
    weights = "bfloat16";  // as the server's manifest does
  }
  const auto linear_dtype = krause::ParseLinearDtype(weights, "--weights_dtype");
  if (!linear_dtype.ok()) return Fail(std::string(linear_dtype.status().message()));
  auto gen = krause::LoadModel(gen_path, device, *linear_dtype);
  if (!gen.ok()) return Fail(gen.status().ToString());
  if (gen->classifier()) return Fail(gen_path + " is a classifier, not a generator");
  auto cls = krause::LoadModel(absl::GetFlag(FLAGS_classifier), device);
  if (!cls.ok()) return Fail(cls.status().ToString());
  if (!cls->classifier()) return Fail(absl::GetFlag(FLAGS_classifier) + " is not a classifier");
  const krause::PixelModel& arm = *gen->pixel;
  // The precision that runs here; in bf16 the packed step scores bits/dim through its GEMMs, as a
  // served Score does (fp32 scores with the LibTorch forward and needs no packed step).
  std::string fallback;
  const krause::Precision runs = arm.device().is_cpu()
                                     ? krause::nn::EffectivePrecision(*precision, &fallback)
                                     : krause::Precision::kFp32;
  if (!fallback.empty())
    std::fprintf(stderr, "krause-eval: bf16 falls back to fp32: %s\n", fallback.c_str());
  std::unique_ptr<krause::CpuDecoder> scorer;
  if (runs == krause::Precision::kBf16) {
    auto d = krause::CpuDecoder::Create(arm, {}, runs);
    if (!d.ok()) return Fail(d.status().ToString());
    scorer = std::move(*d);
  }
  const krause::ViT& vit = *cls->vit;
  const krause::PixelModelConfig& ac = arm.config();
  auto test = krause::LoadDataset(absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_data_dir), false);
  if (!test.ok()) return Fail(test.status().ToString());
  if (test->images.size(1) != ac.channels || test->images.size(2) != ac.height ||
      test->images.size(3) != ac.width_px) {
    return Fail("the test images do not have the generator's shape");
  }
  const bool conditional = ac.conditional() && !absl::GetFlag(FLAGS_unconditional);
  if (conditional && ac.classes != static_cast<int64_t>(vit.config().classes)) {
    return Fail(absl::StrCat("the generator has ", ac.classes, " classes, the classifier ",
                             vit.config().classes));
  }
  const int64_t real_n = std::min<int64_t>(count, test->size() / 2);
  const double guidance = conditional ? absl::GetFlag(FLAGS_guidance) : 1.0;
  if (!conditional && absl::GetFlag(FLAGS_guidance) != 1.0)
    return Fail("--guidance needs a conditional model sampled with classes");
  std::printf(
      "krause-eval: %s (%s), %lld samples%s, seed %llu, temperature %g, top_p %g, top_k %d, "
      "guidance %g\n",
      gen_path.c_str(), ac.attention == krause::AttentionKind::kKrause ? "KARM" : "ARM",
      static_cast<long long>(count),
      conditional        ? absl::StrCat(" (class i % ", ac.classes, " for image i)").c_str()
      : ac.conditional() ? " (without a class)"
                         : "",
      static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)), absl::GetFlag(FLAGS_temperature),
      absl::GetFlag(FLAGS_top_p), absl::GetFlag(FLAGS_top_k), guidance);

  // 1. Samples.
  std::vector<int64_t> labels(count, -1);
  if (conditional)
    for (int64_t i = 0; i < count; ++i) labels[i] = i % ac.classes;
  krause::SamplingParams sp;
  sp.temperature = absl::GetFlag(FLAGS_temperature);
  sp.top_p = absl::GetFlag(FLAGS_top_p);
  sp.top_k = absl::GetFlag(FLAGS_top_k);
  if (absl::Status st = krause::ValidateSampling(sp); !st.ok()) return Fail(st.ToString());
  const auto t_sample = Clock::now();
  auto samples = krause::SampleImages(
      arm, labels, absl::GetFlag(FLAGS_seed), sp,
      [&](int64_t done) { Progress("sampling", done, count, t_sample); }, guidance, *precision);
  if (!samples.ok()) return Fail(samples.status().ToString());
  const double sample_seconds = Since(t_sample);

  // 2. Classifier features: samples, real test images [0, R) and [R, 2R) (the floor).
  auto fs = krause::Classify(vit, *samples);
  auto fr = krause::Classify(vit, test->images.narrow(0, 0, real_n));
  auto fr2 = krause::Classify(vit, test->images.narrow(0, real_n, real_n));
  if (!fs.ok()) return Fail(fs.status().ToString());
  if (!fr.ok()) return Fail(fr.status().ToString());
  if (!fr2.ok()) return Fail(fr2.status().ToString());
  auto fd = krause::FrechetDistance(fs->features, fr->features);
  auto floor = krause::FrechetDistance(fr2->features, fr->features);
  if (!fd.ok()) return Fail(fd.status().ToString());
  if (!floor.ok()) return Fail(floor.status().ToString());
  const double top1_samples = std::get<0>(fs->probabilities.max(1)).mean().item<double>();
  const double top1_real = std::get<0>(fr->probabilities.max(1)).mean().item<double>();
  nlohmann::json report = {
      {"generator", gen_path},
      {"classifier", absl::GetFlag(FLAGS_classifier)},
      {"weights_dtype", weights},
      {"precision", krause::PrecisionName(runs)},
      {"linear_kernels",
       arm.device().is_cpu() ? krause::nn::LinearKernelsName(runs) : std::string()},
      {"samples", count},
      {"conditional", conditional},
      {"seed", absl::GetFlag(FLAGS_seed)},
      {"temperature", absl::GetFlag(FLAGS_temperature)},
      {"guidance", guidance},
      {"top_p", sp.top_p},
      {"top_k", sp.top_k},
      {"sampling_seconds", sample_seconds},
      {"frechet_distance", *fd},
      {"frechet_distance_real_floor", *floor},
      {"real_images", real_n},
      {"mean_top1_probability_samples", top1_samples},
      {"mean_top1_probability_real", top1_real}};
  std::printf("Frechet distance of classifier features, %lld samples vs test[0:%lld): %.3f\n",
              static_cast<long long>(count), static_cast<long long>(real_n), *fd);
  std::printf("  floor: test[%lld:%lld) vs test[0:%lld): %.3f\n", static_cast<long long>(real_n),
              static_cast<long long>(2 * real_n), static_cast<long long>(real_n), *floor);
  std::printf("classifier mean top-1 probability: samples %.3f, real test images %.3f\n",
              top1_samples, top1_real);

  // 3. Conditional: the share assigned to the requested class.
  if (conditional) {
    const at::Tensor pred = fs->probabilities.argmax(1);
    const at::Tensor want = at::tensor(labels, at::kLong);
    nlohmann::json per_class = nlohmann::json::array();
    double sum = 0;
    std::printf("assigned to the requested class:\n");
    for (int64_t c = 0; c < ac.classes; ++c) {
      const at::Tensor mine = want == c;
      const double n = mine.sum().item<double>();
      const double hit = n > 0 ? ((pred == want) & mine).sum().item<double>() / n : 0.0;
      sum += hit;
      const std::string name = ac.labels.empty() ? std::to_string(c) : ac.labels[c];
      per_class.push_back({{"class", c}, {"label", name}, {"samples", n}, {"assigned", hit}});
      std::printf("  %-12s %5.1f%% of %.0f\n", name.c_str(), 100 * hit, n);
    }
    report["assigned_to_requested_class_mean"] = sum / ac.classes;
    report["assigned_to_requested_class"] = per_class;
    // The same judge on real images (its accuracy on test[0, R)), for scale.
    const at::Tensor real_labels = test->labels.narrow(0, 0, real_n).to(at::kLong);
    const double real_acc =
        (fr->probabilities.argmax(1) == real_labels).to(at::kDouble).mean().item<double>();
    report["classifier_accuracy_real"] = real_acc;
    std::printf("  mean over classes: %.1f%% (the classifier's accuracy on test[0:%lld): %.1f%%)\n",
                100 * sum / ac.classes, static_cast<long long>(real_n), 100 * real_acc);
  }

  // 4. The grid: a conditional model one row per class (its first `columns` samples).
  std::filesystem::create_directories(out_dir);
  const at::Tensor grid =
      conditional
          ? krause::ClassRowsGrid(*samples, ac.classes,
                                  std::max<int64_t>(1, std::min(columns, count / ac.classes)))
          : krause::ImageGrid(samples->narrow(0, 0, std::min(count, columns * columns)), columns);
  const absl::Status png = krause::WritePng(out_dir + "/grid.png", grid);
  if (!png.ok()) return Fail(png.ToString());

  // 5. Bits/dim over the test set.
  if (absl::GetFlag(FLAGS_bits_per_dim)) {
    int64_t n = test->size();
    if (absl::GetFlag(FLAGS_test_limit) > 0) n = std::min(n, absl::GetFlag(FLAGS_test_limit));
    const at::Tensor flat = test->images.narrow(0, 0, n).permute({0, 2, 3, 1}).reshape({n, -1});
    double sum_c = 0, sum_u = 0;
    const int64_t batch = 100;
    const auto t_score = Clock::now();
    for (int64_t s = 0; s < n; s += batch) {
      const int64_t b = std::min(batch, n - s);
      const at::Tensor x = flat.narrow(0, s, b);
      auto u = krause::ScoreBitsPerDim(arm, x, {}, krause::KrauseImpl::kAuto, scorer.get());
      if (!u.ok()) return Fail(u.status().ToString());
      for (double v : *u) sum_u += v;
      if (ac.conditional()) {
        const at::Tensor l = test->labels.narrow(0, s, b).contiguous();
        auto c = krause::ScoreBitsPerDim(
            arm, x, std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + b),
            krause::KrauseImpl::kAuto, scorer.get());
        if (!c.ok()) return Fail(c.status().ToString());
        for (double v : *c) sum_c += v;
      }
      Progress("bits/dim", s + b, n, t_score);
    }
    report["test_images_scored"] = n;
    report["bits_per_dim_unconditional"] = sum_u / n;
    if (ac.conditional()) {
      report["bits_per_dim_conditional"] = sum_c / n;
      std::printf("bits/dim on %lld test images: %.4f given each image's class, %.4f without\n",
                  static_cast<long long>(n), sum_c / n, sum_u / n);
    } else {
      std::printf("bits/dim on %lld test images: %.4f\n", static_cast<long long>(n), sum_u / n);
    }
  }
  std::ofstream(out_dir + "/report.json") << report.dump(2) << "\n";
  std::printf("wrote %s/grid.png%s and %s/report.json\n", out_dir.c_str(),
              conditional ? " (one row per class)" : "", out_dir.c_str());
  return 0;
}
