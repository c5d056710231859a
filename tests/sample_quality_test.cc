// The sample-quality measures of model/eval/: the Frechet distance against closed forms and its
// invariances, the classifier's features as the head's input, and the engine-drawn samples.
#include "model/eval/sample_quality.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/data/png.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FrechetDistance, MatchesTheClosedFormOfOneDimensionAndOfDiagonalCovariances) {
  // 1-D: (m_a - m_b)^2 + (s_a - s_b)^2 with unbiased standard deviations.
  const at::Tensor a = at::randn({500, 1}, at::kDouble) * 2 + 1;
  const at::Tensor b = at::randn({300, 1}, at::kDouble) * 0.5 - 2;
  const double ma = a.mean().item<double>(), mb = b.mean().item<double>();
  const double sa = a.std().item<double>(), sb = b.std().item<double>();
  KRAUSE_ASSERT_OK_AND_ASSIGN(double fd, FrechetDistance(a, b));
  EXPECT_NEAR(fd, (ma - mb) * (ma - mb) + (sa - sb) * (sa - sb), 1e-9);
  // Two independent coordinates with exactly uncorrelated samples (a grid of +-1 pairs): the
  // sum of the per-coordinate distances.
  std::vector<double> xa, xb;
  for (int i = 0; i < 4; ++i) {
    const double u = i & 1 ? 1 : -1, v = i & 2 ? 1 : -1;
    xa.insert(xa.end(), {3 * u, 0.5 * v});
    xb.insert(xb.end(), {1 + u, 2 + 2 * v});
  }
  const at::Tensor ga = at::tensor(xa, at::kDouble).view({4, 2});
  const at::Tensor gb = at::tensor(xb, at::kDouble).view({4, 2});
  const double s = std::sqrt(4.0 / 3.0);  // unbiased std of {-1, -1, 1, 1}
  const double expect = 1 + 4 + std::pow(3 * s - s, 2) + std::pow(0.5 * s - 2 * s, 2);
  KRAUSE_ASSERT_OK_AND_ASSIGN(double fd2, FrechetDistance(ga, gb));
  EXPECT_NEAR(fd2, expect, 1e-9);
}

TEST(FrechetDistance, IsZeroForOneSetAndInvariantUnderRotationAndShift) {
  const at::Tensor a = at::randn({200, 6}, at::kDouble) * at::linspace(0.5, 3, 6, at::kDouble);
  const at::Tensor b = at::randn({150, 6}, at::kDouble) + 0.3;
  KRAUSE_ASSERT_OK_AND_ASSIGN(double self, FrechetDistance(a, a));
  EXPECT_NEAR(self, 0.0, 1e-8);
  KRAUSE_ASSERT_OK_AND_ASSIGN(double fd, FrechetDistance(a, b));
  EXPECT_GT(fd, 0.5);
  const at::Tensor q = std::get<0>(at::linalg_qr(at::randn({6, 6}, at::kDouble)));
  const at::Tensor shift = at::randn({6}, at::kDouble);
  KRAUSE_ASSERT_OK_AND_ASSIGN(double moved,
                              FrechetDistance(at::matmul(a, q) + shift, at::matmul(b, q) + shift));
  EXPECT_NEAR(moved, fd, 1e-8 * std::max(1.0, fd));
  KRAUSE_ASSERT_OK_AND_ASSIGN(double swapped, FrechetDistance(b, a));
  EXPECT_NEAR(swapped, fd, 1e-8 * std::max(1.0, fd));
  EXPECT_THAT(FrechetDistance(a, at::randn({5, 4})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("same D")));
  EXPECT_THAT(FrechetDistance(a.narrow(0, 0, 1), b).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(">= 2")));
}

TEST(Classify, FeaturesAreTheHeadsInputAndProbabilitiesItsSoftmax) {
  ViTConfig c;
  c.image_size = 8;
  c.patch = 4;
  c.d_model = 16;
  c.depth = 1;
  c.heads = 2;
  c.mlp = 32;
  c.classes = 3;
  const ViT vit = ViT::Create(c, 2).value();
  const at::Tensor imgs = at::randint(0, 256, {5, 1, 8, 8}, at::kLong).to(at::kByte);
  KRAUSE_ASSERT_OK_AND_ASSIGN(ClassifierOutputs out, Classify(vit, imgs, /*batch=*/2));
  ASSERT_EQ(out.features.sizes(), (std::vector<int64_t>{5, 16}));
  at::NoGradGuard no_grad;
  const at::Tensor logits = vit.Forward(NormalizePixels(c, imgs));
  EXPECT_TRUE(at::allclose(out.probabilities, at::softmax(logits, -1), 1e-5, 1e-6));
  const at::Tensor head = at::linear(out.features, vit.parameters().Get("head.weight"),
                                     vit.parameters().Get("head.bias"));
  EXPECT_TRUE(at::allclose(head, logits, 1e-5, 1e-5));
  EXPECT_THAT(Classify(vit, at::zeros({1, 1, 6, 6}, at::kByte)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("uint8 [N, 1, 8, 8]")));
}

TEST(SampleImages, DrawsWhatTheEngineDrawsPerSeedAndClass) {
  PixelModelConfig c;
  c.height = 3;
  c.width_px = 4;
  c.d_model = 16;
  c.depth = 1;
  c.heads = 2;
  c.window = 5;
  c.top_k = 3;
  c.classes = 2;
  PixelModel m = PixelModel::Create(c, 9).value();
  {
    at::NoGradGuard no_grad;
    m.parameters().Get("class_emb.weight").mul_(40);
  }
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor a, SampleImages(m, {0, 1, -1, 0}, 7));
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{4, 1, 3, 4}));
  // Image i depends on (seed + i, class) only.
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor b, SampleImages(m, {1, 0}, 8));
  EXPECT_TRUE(at::equal(a[1], b[0]));
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor other, SampleImages(m, {1}, 7));
  EXPECT_FALSE(at::equal(a[0], other[0]));
  EXPECT_THAT(SampleImages(m, {2}, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("image 0: class 2")));
}

TEST(ImageGrid, TilesRowMajorWithGaps) {
  const at::Tensor imgs =
      at::arange(5, at::kLong).view({5, 1, 1, 1}).expand({5, 1, 2, 3}).to(at::kByte);
  const at::Tensor g = ImageGrid(imgs, 2);  // 3 rows x 2 columns of 2x3 images
  ASSERT_EQ(g.sizes(), (std::vector<int64_t>{3 * 3 + 1, 2 * 4 + 1, 1}));
  EXPECT_EQ(g[1][1][0].item<int>(), 0);
  EXPECT_EQ(g[1][5][0].item<int>(), 1);
  EXPECT_EQ(g[4][1][0].item<int>(), 2);
  EXPECT_EQ(g[7][1][0].item<int>(), 4);
  EXPECT_EQ(g[7][5][0].item<int>(), 128);  // the empty sixth cell
  EXPECT_EQ(g[0][0][0].item<int>(), 128);
}

TEST(ClassRowsGrid, OneRowPerClassOfItsFirstImagesAndGrayWhereNoneIsLeft) {
  // 5 images of 2 classes (image i is class i % 2): class 0 has images 0, 2, 4, class 1 has 1, 3.
  const at::Tensor imgs =
      at::arange(5, at::kLong).view({5, 1, 1, 1}).expand({5, 1, 2, 2}).to(at::kByte);
  const at::Tensor g = ClassRowsGrid(imgs, 2, 3);  // 2 rows x 3 columns of 2x2 images
  ASSERT_EQ(g.sizes(), (std::vector<int64_t>{2 * 3 + 1, 3 * 3 + 1, 1}));
  EXPECT_EQ(g[1][1][0].item<int>(), 0);
  EXPECT_EQ(g[1][4][0].item<int>(), 2);
  EXPECT_EQ(g[1][7][0].item<int>(), 4);
  EXPECT_EQ(g[4][1][0].item<int>(), 1);
  EXPECT_EQ(g[4][4][0].item<int>(), 3);
  EXPECT_EQ(g[4][7][0].item<int>(), 128);  // class 1 has no third image
}

}  // namespace
}  // namespace krause
