// The bundled default models (models/*.safetensors) load strictly and reproduce the test figures
// recorded in their metadata (the summary krause-train wrote, from which the model cards are
// made), on the Fashion-MNIST test split from its Debian package.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/checkpoint/safetensors.h"
#include "model/data/datasets.h"
#include "model/karm.h"
#include "model/vit.h"
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
  at::set_num_threads(2);
  at::NoGradGuard no_grad;
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    KRAUSE_ASSERT_OK_AND_ASSIGN(SafetensorsContents c, ReadSafetensors(path));
    const nlohmann::json summary = nlohmann::json::parse(c.metadata.at("summary"));
    ASSERT_EQ(summary["data"], "fashion-mnist");
    const int64_t n = summary["test_images"].get<int64_t>();
    const nlohmann::json config = nlohmann::json::parse(c.metadata.at("config"));
    if (config["model"] == "vit") {
      KRAUSE_ASSERT_OK_AND_ASSIGN(ViTConfig cfg, ViTConfig::FromJson(c.metadata.at("config")));
      KRAUSE_ASSERT_OK_AND_ASSIGN(ViT m, ViT::Create(cfg, 0));
      ASSERT_TRUE(m.parameters().LoadStrict(c.tensors).ok());
      int64_t correct = 0;
      for (int64_t s = 0; s < n; s += 500) {
        const int64_t b = std::min<int64_t>(500, n - s);
        at::Tensor x = test.images.narrow(0, s, b).to(at::kFloat) / 255.0;
        x = (x - cfg.mean[0]) / cfg.std[0];
        const at::Tensor pred = m.Forward(x).argmax(1);
        correct += (pred == test.labels.narrow(0, s, b)).sum().item<int64_t>();
      }
      const double accuracy = static_cast<double>(correct) / n;
      EXPECT_NEAR(accuracy, summary["test_accuracy"].get<double>(), 0.5 / n);
    } else {
      KRAUSE_ASSERT_OK_AND_ASSIGN(ArmConfig cfg, ArmConfig::FromJson(c.metadata.at("config")));
      KRAUSE_ASSERT_OK_AND_ASSIGN(Arm m, Arm::Create(cfg, 0));
      ASSERT_TRUE(m.parameters().LoadStrict(c.tensors).ok());
      double nll = 0;
      for (int64_t s = 0; s < n; s += 100) {
        const int64_t b = std::min<int64_t>(100, n - s);
        const at::Tensor px =
            test.images.narrow(0, s, b).permute({0, 2, 3, 1}).reshape({b, -1}).to(at::kLong);
        nll += m.NllPerImage(px).sum().item<double>();
      }
      EXPECT_NEAR(nll / n / std::log(2.0), summary["test_bits_per_dim"].get<double>(), 1e-4);
    }
  }
}

}  // namespace
}  // namespace krause
