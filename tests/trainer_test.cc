// krause-train's loop end to end on tiny generated data sets: a Krause ViT learns an easy task,
// resumes from its checkpoint, and writes a loadable model, summary and curve; a KARM trains,
// reports bits/dim and samples images.
#include "model/train/trainer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/checkpoint/safetensors.h"
#include "model/data/png.h"
#include "model/eval/sample_quality.h"
#include "model/loader.h"
#include "model/pixel_model.h"
#include "model/train/optimizer.h"
#include "model/vit.h"
#include "tests/test_util.h"

namespace krause {
namespace {

void WriteIdx(const std::string& path, const at::Tensor& t) {
  std::string s = {0, 0, 0x08, static_cast<char>(t.dim())};
  for (int64_t d : t.sizes()) {
    for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((d >> (8 * i)) & 0xff));
  }
  const at::Tensor c = t.contiguous();
  s.append(static_cast<const char*>(c.data_ptr()), c.numel());
  std::ofstream(path, std::ios::binary) << s;
}

// Class 0: bright top half; class 1: bright bottom half; plus noise. 8x8 images.
// Each test uses its own folder: ctest runs the tests of this file in parallel processes.
std::string MakeData(const std::string& name, int64_t n_train, int64_t n_test) {
  const std::string dir = ::testing::TempDir() + "/toy-mnist-" + name;
  std::filesystem::create_directories(dir);
  at::manual_seed(3);
  for (auto [split, n] : {std::pair<const char*, int64_t>{"train", n_train}, {"t10k", n_test}}) {
    const at::Tensor labels = at::randint(0, 2, {n}, at::kByte);
    at::Tensor img = at::randint(0, 60, {n, 8, 8}, at::kLong);
    for (int64_t i = 0; i < n; ++i) {
      img[i].narrow(0, labels[i].item<int>() == 0 ? 0 : 4, 4).add_(150);
    }
    WriteIdx(dir + "/" + split + "-images-idx3-ubyte", img.to(at::kByte));
    WriteIdx(dir + "/" + split + "-labels-idx1-ubyte", labels);
  }
  return dir;
}

// Options for a 1-thread, quiet run of `model` on the toy data in a fresh output folder.
TrainOptions ToyRun(const std::string& model, const std::string& tag, int64_t n_train,
                    int64_t n_test) {
  TrainOptions o;
  o.model = model;
  o.data = "mnist";
  o.data_dir = MakeData(tag, n_train, n_test);
  o.out_dir = ::testing::TempDir() + "/train-" + tag;
  std::filesystem::remove_all(o.out_dir);
  o.batch = 16;
  o.threads = 1;
  o.quiet = true;
  return o;
}

nlohmann::json Summary(const std::string& out) {
  std::ifstream f(out + "/summary.json");
  return nlohmann::json::parse(f);
}

TEST(Trainer, KrauseViTLearnsResumesAndWritesItsOutputs) {
  TrainOptions o = ToyRun("krause_vit", "kvit", 512, 128);
  o.lr = 1e-2;
  o.vit.patch = 2;
  o.vit.d_model = 16;
  o.vit.depth = 2;
  o.vit.heads = 2;
  o.vit.mlp = 32;
  o.epochs = 3;
  ASSERT_TRUE(Train(o).ok());
  const nlohmann::json first = Summary(o.out_dir);
  ASSERT_EQ(first["history"].size(), 3u);

  o.epochs = 6;
  o.resume = true;
  ASSERT_TRUE(Train(o).ok());
  const nlohmann::json s = Summary(o.out_dir);
  ASSERT_EQ(s["history"].size(), 6u);
  EXPECT_EQ(s["history"][2], first["history"][2]);  // resumed, not retrained
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.9);
  EXPECT_EQ(s["storage"], "F16");
  EXPECT_GT(s["parameters"].get<int64_t>(), 0);

  // The stored model loads from its own metadata and reproduces the reported accuracy's inputs.
  KRAUSE_ASSERT_OK_AND_ASSIGN(SafetensorsContents c,
                              ReadSafetensors(o.out_dir + "/model.safetensors"));
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViTConfig cfg, ViTConfig::FromJson(c.metadata.at("config")));
  EXPECT_EQ(cfg.mean.size(), 1u);
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT m, ViT::Create(cfg, 0));
  EXPECT_TRUE(m.parameters().LoadStrict(c.tensors).ok());
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor curve, ReadPng(o.out_dir + "/curve.png"));
  EXPECT_EQ(curve.size(2), 3);
}

TEST(Trainer, KarmTrainsAndSamples) {
  TrainOptions o = ToyRun("karm", "karm", 64, 16);
  o.epochs = 2;
  o.pixel.d_model = 16;
  o.pixel.depth = 1;
  o.pixel.heads = 2;
  o.pixel.window = 8;
  o.pixel.top_k = 4;
  o.samples = 4;
  ASSERT_TRUE(Train(o).ok());
  const nlohmann::json s = Summary(o.out_dir);
  const double bpd = s["test_bits_per_dim"].get<double>();
  EXPECT_GT(bpd, 0.0);
  EXPECT_LT(bpd, 8.0);  // better than uniform over 256 values
  EXPECT_LT(s["flops_per_image_executed"].get<double>(),
            s["flops_per_image_dense_equivalent"].get<double>());
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor samples, ReadPng(o.out_dir + "/samples.png"));
  EXPECT_EQ(samples.size(0), 2 * 9 + 1);  // 2 x 2 grid of 8x8 images with 1-pixel gaps
}

// The toy data's class decides which half of the image is bright: a conditional KARM must score
// the test images better given their classes, and draw the bright half where the class says.
TEST(Trainer, ConditionalKarmLearnsTheClassesAndDrawsThem) {
  TrainOptions o = ToyRun("karm", "karm-cond", 2048, 64);
  o.epochs = 3;
  o.lr = 1e-2;
  o.pixel.d_model = 16;
  o.pixel.depth = 2;
  o.pixel.heads = 2;
  o.pixel.window = 8;
  o.pixel.top_k = 4;
  o.samples = 3;
  o.conditional = true;
  o.label_drop = 0.2;
  ASSERT_TRUE(Train(o).ok());
  const nlohmann::json s = Summary(o.out_dir);
  EXPECT_EQ(s["config"]["classes"].get<int64_t>(), 10);  // MNIST's label names
  // The class is worth about 1 bit per 64-subpixel image here: ~0.016 bits/dim.
  EXPECT_LT(s["test_bits_per_dim"].get<double>(),
            s["test_bits_per_dim_unconditional"].get<double>() - 0.005);
  KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadModel(o.out_dir + "/model.safetensors"));
  ASSERT_TRUE(m.pixel != nullptr);
  EXPECT_TRUE(m.pixel->parameters().Has("class_emb.weight"));
  // samples.png: one row per class (10 rows of 3 images of 8x8, 1-pixel gaps).
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor grid, ReadPng(o.out_dir + "/samples.png"));
  EXPECT_EQ(grid.size(0), 10 * 9 + 1);
  EXPECT_EQ(grid.size(1), 3 * 9 + 1);
  // Classes 0 and 1 through the engine: the bright half follows the class.
  std::vector<int64_t> labels;
  for (int i = 0; i < 16; ++i) labels.push_back(i % 2);
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor imgs, SampleImages(*m.pixel, labels, 100));
  // After 3 short epochs a sample may still draw the other mode; without conditioning about
  // half would.
  const at::Tensor f = imgs.to(at::kFloat);
  int follow = 0;
  for (int i = 0; i < 16; ++i) {
    const double top = f[i].narrow(1, 0, 4).mean().item<double>();
    const double bottom = f[i].narrow(1, 4, 4).mean().item<double>();
    follow += i % 2 == 0 ? top > bottom + 40 : bottom > top + 40;
  }
  EXPECT_GE(follow, 13) << "samples whose bright half follows their class, of 16";
}

TEST(Trainer, BadOptionsAreErrors) {
  TrainOptions o;
  o.model = "resnet";
  o.data_dir = MakeData("bad", 8, 8);
  o.data = "mnist";
  o.quiet = true;
  o.out_dir = ::testing::TempDir() + "/train-bad";
  EXPECT_EQ(Train(o).code(), absl::StatusCode::kInvalidArgument);
  o.model = "vit";
  o.data = "svhn";
  EXPECT_EQ(Train(o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Schedule, WarmupThenCosine) {
  EXPECT_DOUBLE_EQ(WarmupCosine(0, 10, 110, 1.0), 0.1);
  EXPECT_DOUBLE_EQ(WarmupCosine(9, 10, 110, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(WarmupCosine(10, 10, 110, 1.0), 1.0);
  EXPECT_NEAR(WarmupCosine(60, 10, 110, 1.0), 0.5, 1e-12);
  EXPECT_NEAR(WarmupCosine(110, 10, 110, 1.0), 0.0, 1e-12);
}

}  // namespace
}  // namespace krause
