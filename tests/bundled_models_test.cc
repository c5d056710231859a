// The bundled default models (models/*.safetensors) load strictly (model/loader.h) and reproduce
// the test figures recorded in their metadata (the summary krause-train wrote, from which the model
// cards are made), on the Fashion-MNIST test split from its Debian package; with bfloat16 linear
// weights, the Krause models' figures stay within the stated margins of their fp32 ones.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/data/datasets.h"
#include "model/loader.h"
#include "model/nn/dnnl_linear.h"
#include "model/util/threads.h"
#include "model/vit_cpu.h"
#include "tests/test_util.h"

namespace krause {
namespace {

std::vector<std::string> BundledModels() {
  std::vector<std::string> paths;
  const std::filesystem::path dir = std::filesystem::path(KRAUSE_SOURCE_DIR) / "models";
  if (std::filesystem::exists(dir)) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// A model's test figures on the first n test images: a classifier's accuracy; a generator's
// bits/dim given each image's class (conditional models) and without.
struct Figures {
  double accuracy = 0;
  double bits_per_dim = 0, bits_per_dim_unconditional = 0;
};

Figures Measure(const LoadedModel& m, const ImageDataset& test, int64_t n) {
  at::NoGradGuard no_grad;
  Figures f;
  if (m.classifier()) {
    int64_t correct = 0;
    for (int64_t s = 0; s < n; s += 500) {
      const int64_t b = std::min<int64_t>(500, n - s);
      const at::Tensor x = NormalizePixels(m.vit->config(), test.images.narrow(0, s, b));
      const at::Tensor pred = m.vit->Forward(x).argmax(1);
      correct += (pred == test.labels.narrow(0, s, b)).sum().item<int64_t>();
    }
    f.accuracy = static_cast<double>(correct) / n;
    return f;
  }
  const bool conditional = m.pixel->config().conditional();
  double nll = 0, nll_unconditional = 0;
  for (int64_t s = 0; s < n; s += 100) {
    const int64_t b = std::min<int64_t>(100, n - s);
    const at::Tensor px =
        test.images.narrow(0, s, b).permute({0, 2, 3, 1}).reshape({b, -1}).to(at::kLong);
    if (conditional) {
      nll += m.pixel->NllPerImage(px, KrauseImpl::kAuto, test.labels.narrow(0, s, b))
                 .sum()
                 .item<double>();
    }
    nll_unconditional += m.pixel->NllPerImage(px).sum().item<double>();
  }
  f.bits_per_dim_unconditional = nll_unconditional / n / std::log(2.0);
  f.bits_per_dim = conditional ? nll / n / std::log(2.0) : f.bits_per_dim_unconditional;
  return f;
}

TEST(BundledModels, ReproduceTheirRecordedTestFigures) {
  const std::vector<std::string> paths = BundledModels();
  if (paths.empty()) GTEST_SKIP() << "no bundled models in models/";
  KRAUSE_ASSERT_OK_AND_ASSIGN(ImageDataset test,
                              LoadFashionMnist("/usr/share/datasets/fashion-mnist", false));
  krause::SetCpuThreads(2);
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadModel(path));
    const nlohmann::json summary = nlohmann::json::parse(m.metadata.at("summary"));
    ASSERT_EQ(summary["data"], "fashion-mnist");
    const int64_t n = summary["test_images"].get<int64_t>();
    const Figures f = Measure(m, test, n);
    if (m.classifier()) {
      EXPECT_NEAR(f.accuracy, summary["test_accuracy"].get<double>(), 0.5 / n);
    } else if (m.pixel->config().conditional()) {
      // A conditional generator records its bits/dim given each image's class, and without.
      EXPECT_NEAR(f.bits_per_dim, summary["test_bits_per_dim"].get<double>(), 1e-4);
      EXPECT_NEAR(f.bits_per_dim_unconditional,
                  summary["test_bits_per_dim_unconditional"].get<double>(), 1e-4);
    } else {
      EXPECT_NEAR(f.bits_per_dim, summary["test_bits_per_dim"].get<double>(), 1e-4);
    }
  }
}

// Served with bfloat16 linear weights ("weights_dtype": "bfloat16", ParameterStore::RoundLinear),
// the Krause models keep their quality: accuracy within 0.2 points, bits/dim within 0.01 of the
// fp32 weights' on the same test images. Prints both (the model cards quote them).
TEST(BundledModels, KeepTheirQualityWithBf16Weights) {
  std::vector<std::string> paths;
  for (const std::string& p : BundledModels())
    if (p.find("krause_vit") != std::string::npos || p.find("karm") != std::string::npos)
      paths.push_back(p);
  if (paths.empty()) GTEST_SKIP() << "no bundled Krause models in models/";
  KRAUSE_ASSERT_OK_AND_ASSIGN(ImageDataset test,
                              LoadFashionMnist("/usr/share/datasets/fashion-mnist", false));
  krause::SetCpuThreads(2);
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel fp32, LoadModel(path));
    KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel bf16, LoadModel(path, "cpu", at::kBFloat16));
    const int64_t n =
        nlohmann::json::parse(fp32.metadata.at("summary"))["test_images"].get<int64_t>();
    const Figures a = Measure(fp32, test, n), b = Measure(bf16, test, n);
    if (fp32.classifier()) {
      std::printf("%s: test accuracy on %lld images: fp32 weights %.2f%%, bf16 weights %.2f%%\n",
                  path.c_str(), static_cast<long long>(n), 100 * a.accuracy, 100 * b.accuracy);
      EXPECT_LE(std::abs(a.accuracy - b.accuracy), 0.002);
    } else {
      std::printf(
          "%s: test bits/dim on %lld images (given the class; without): fp32 weights %.5f; "
          "%.5f, bf16 weights %.5f; %.5f\n",
          path.c_str(), static_cast<long long>(n), a.bits_per_dim, a.bits_per_dim_unconditional,
          b.bits_per_dim, b.bits_per_dim_unconditional);
      EXPECT_LE(std::abs(a.bits_per_dim - b.bits_per_dim), 0.01);
      EXPECT_LE(std::abs(a.bits_per_dim_unconditional - b.bits_per_dim_unconditional), 0.01);
      EXPECT_NE(a.bits_per_dim, b.bits_per_dim) << "the rounding changed nothing";
    }
  }
}

// Served in the bf16 precision ("precision": "bf16": the rounded weights, bfloat16 activations
// into oneDNN's GEMMs), the bundled Krause ViT keeps its accuracy within 0.3 points of the fp32
// forward's on all 10,000 test images, both through the packed forward the server runs. Prints
// both (the model card quotes them). Skips where this CPU has no AMX.
TEST(BundledModels, TheKrauseViTKeepsItsAccuracyInTheBf16Precision) {
  if (!nn::Bf16MatmulSupport().available) GTEST_SKIP() << nn::Bf16MatmulSupport().why;
  std::string path;
  for (const std::string& p : BundledModels())
    if (p.find("krause_vit") != std::string::npos) path = p;
  if (path.empty()) GTEST_SKIP() << "no bundled Krause ViT in models/";
  KRAUSE_ASSERT_OK_AND_ASSIGN(ImageDataset test,
                              LoadFashionMnist("/usr/share/datasets/fashion-mnist", false));
  krause::SetCpuThreads(2);
  KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel fp32, LoadModel(path));
  KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel rounded, LoadModel(path, "cpu", at::kBFloat16));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto a, CpuViT::Create(*fp32.vit));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto b, CpuViT::Create(*rounded.vit, Precision::kBf16));
  ASSERT_EQ(b->precision(), Precision::kBf16);
  const int64_t n = test.images.size(0);
  const at::Tensor pixels = test.images.contiguous();
  double accuracy[2];
  for (int k : {0, 1}) {
    at::Tensor probs = at::empty({n, a->classes()});
    ASSERT_TRUE(
        (k == 0 ? *a : *b).Forward(pixels.data_ptr<uint8_t>(), n, probs.data_ptr<float>()).ok());
    accuracy[k] = (probs.argmax(1) == test.labels).sum().item<double>() / n;
  }
  std::printf("%s: test accuracy on %lld images: fp32 %.2f%%, bf16 precision (%s) %.2f%%\n",
              path.c_str(), static_cast<long long>(n), 100 * accuracy[0],
              b->linear_kernels().c_str(), 100 * accuracy[1]);
  EXPECT_LE(std::abs(accuracy[0] - accuracy[1]), 0.003);
}

}  // namespace
}  // namespace krause
