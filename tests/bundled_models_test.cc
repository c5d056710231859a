// The bundled default models (models/*.safetensors) load strictly (model/loader.h) and reproduce
// the test figures recorded in their metadata (the summary krause-train wrote, from which the model
// cards are made), on the Fashion-MNIST test split from its Debian package.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/data/datasets.h"
#include "model/loader.h"
#include "model/util/threads.h"
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

TEST(BundledModels, ReproduceTheirRecordedTestFigures) {
  const std::vector<std::string> paths = BundledModels();
  if (paths.empty()) GTEST_SKIP() << "no bundled models in models/";
  KRAUSE_ASSERT_OK_AND_ASSIGN(ImageDataset test,
                              LoadFashionMnist("/usr/share/datasets/fashion-mnist", false));
  krause::SetCpuThreads(2);
  at::NoGradGuard no_grad;
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadModel(path));
    const nlohmann::json summary = nlohmann::json::parse(m.metadata.at("summary"));
    ASSERT_EQ(summary["data"], "fashion-mnist");
    const int64_t n = summary["test_images"].get<int64_t>();
    if (m.classifier()) {
      int64_t correct = 0;
      for (int64_t s = 0; s < n; s += 500) {
        const int64_t b = std::min<int64_t>(500, n - s);
        const at::Tensor x = NormalizePixels(m.vit->config(), test.images.narrow(0, s, b));
        const at::Tensor pred = m.vit->Forward(x).argmax(1);
        correct += (pred == test.labels.narrow(0, s, b)).sum().item<int64_t>();
      }
      const double accuracy = static_cast<double>(correct) / n;
      EXPECT_NEAR(accuracy, summary["test_accuracy"].get<double>(), 0.5 / n);
    } else {
      // A conditional generator records its bits/dim given each image's class, and without.
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
      if (conditional) {
        EXPECT_NEAR(nll / n / std::log(2.0), summary["test_bits_per_dim"].get<double>(), 1e-4);
        EXPECT_NEAR(nll_unconditional / n / std::log(2.0),
                    summary["test_bits_per_dim_unconditional"].get<double>(), 1e-4);
      } else {
        EXPECT_NEAR(nll_unconditional / n / std::log(2.0),
                    summary["test_bits_per_dim"].get<double>(), 1e-4);
      }
    }
  }
}

}  // namespace
}  // namespace krause
