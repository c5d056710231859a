// The packed CPU decode step (CpuDecoder) beyond one step at a time: the packed prefill is bit for
// bit the steps over the same positions (in each precision, cache dtype and length); bf16
// precision keeps the batch invariance and stays near fp32; the bits per dimension match the
// forward and do not depend on the batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/engine/cpu_decoder.h"
#include "model/kv_cache.h"
#include "model/nn/dnnl_linear.h"
#include "model/pixel_model.h"
#include "model/precision.h"
#include "tests/cpu_decoder_test.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

// The packed prefill of t positions equals t single-sequence Steps bit for bit: the same logits
// and the same cache contents (every length up to the whole image, across the ring's wraps),
// with the other slots untouched, in both precisions (bf16 where this CPU has AMX); the LibTorch
// prefill agrees within rounding only.
TEST_P(CpuDecoderTest, PrefillIsBitForBitTheStepsOverTheSamePositions) {
  const PixelModelConfig& c = model_->config();
  const int64_t n = c.seq_len();
  std::mt19937 rng(9);
  std::vector<int64_t> u = {c.start_token ? PixelModel::kStartToken : 200};
  for (int64_t p = 1; p < n; ++p) u.push_back(static_cast<int64_t>(rng() % 256));
  at::NoGradGuard no_grad;
  // A KARM's bf16 rings too: the prefill appends through the same kernel.
  std::vector<at::ScalarType> dtypes = {at::kFloat};
  if (c.attention == AttentionKind::kKrause) dtypes.push_back(at::kBFloat16);
  std::vector<Precision> precisions = {Precision::kFp32};
  if (nn::Bf16MatmulSupport().available) precisions.push_back(Precision::kBf16);
  for (const Precision precision : precisions) {
    decoder_ = CpuDecoder::Create(*model_, {}, precision).value();
    for (const at::ScalarType dtype : dtypes)
      for (int64_t t : {int64_t{1}, c.window - 1, c.window, c.window + 1, 2 * c.window + 5, n}) {
        SCOPED_TRACE(::testing::Message() << "t " << t << ", cache " << c10::toString(dtype) << ", "
                                          << PrecisionName(precision));
        auto stepped = PixelKvCache::Create(c, 3, at::kCPU, dtype).value();
        auto prefilled = PixelKvCache::Create(c, 3, at::kCPU, dtype).value();
        if (c.conditional()) {
          for (PixelKvCache* k : {&stepped, &prefilled}) {
            k->SetClass(1, 2);
            k->SetClass(0, c.null_class());
          }
        }
        std::vector<float> want(t * 256), got(t * 256);
        const int64_t slot = 1;
        for (int64_t p = 0; p < t; ++p)
          ASSERT_TRUE(decoder_->Step(&u[p], &p, &slot, 1, &stepped, &want[p * 256]).ok());
        ASSERT_TRUE(decoder_->Prefill(u.data(), t, slot, &prefilled, got.data()).ok());
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
        for (int64_t l = 0; l < c.depth; ++l) {
          const auto a = stepped.layer(l).Storage(), b = prefilled.layer(l).Storage();
          for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << l << " " << i;
        }
      }
  }
  // Refusals name what is wrong and write nothing.
  auto cache = PixelKvCache::Create(c, 2).value();
  std::vector<float> logits(2 * 256);
  EXPECT_THAT(decoder_->Prefill(u.data(), 2, 2, &cache, logits.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slot 2 is outside [0, 2)")));
  EXPECT_THAT(decoder_->Prefill(u.data(), n + 1, 0, &cache, logits.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("between 1 and")));
  std::vector<int64_t> bad = {u[0], 300};
  EXPECT_THAT(decoder_->Prefill(bad.data(), 2, 0, &cache, logits.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("u[1] = 300")));
}

// The bf16 precision (oneDNN's GEMMs in fixed 16-row blocks): every plan mode, batch
// composition and thread split gives a sequence the same bits (batches of 20 cross a block's
// edge), and the logits stay near fp32's. Without AMX the
// decoder falls back to fp32 and says why.
TEST_P(CpuDecoderTest, Bf16PrecisionKeepsTheBatchInvarianceAndStaysNearFp32) {
  const at::Tensor fp32 = Run(20, 20, std::nullopt);
  auto dec = CpuDecoder::Create(*model_, {}, Precision::kBf16);
  ASSERT_TRUE(dec.ok()) << dec.status();
  if (!nn::Bf16MatmulSupport().available) {
    EXPECT_EQ((*dec)->precision(), Precision::kFp32);
    EXPECT_EQ((*dec)->fallback(), nn::Bf16MatmulSupport().why);
    GTEST_SKIP() << "no bf16 GEMMs here: " << nn::Bf16MatmulSupport().why;
  }
  EXPECT_EQ((*dec)->precision(), Precision::kBf16);
  decoder_ = std::move(*dec);
  const at::Tensor alone = Run(20, 1, Mode::kInline);
  const double diff = (alone - fp32).abs().max().item<double>();
  EXPECT_GT(diff, 1e-6) << "bf16 GEMMs changed nothing";
  EXPECT_LE(diff, 0.1) << "bf16 far from fp32";
  for (Mode mode : {Mode::kInline, Mode::kSequenceBlocks, Mode::kLayerOps}) {
    for (int64_t group : {int64_t{20}, int64_t{7}}) {
      SCOPED_TRACE(::testing::Message() << "mode " << static_cast<int>(mode) << " group " << group);
      EXPECT_TRUE(at::equal(Run(20, group, mode), alone));
    }
  }
  // Every op split over two threads in pieces of one block.
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  CpuStepTuning tiny;
  tiny.min_task_flops = 1;
  decoder_ = CpuDecoder::Create(*model_, tiny, Precision::kBf16).value();
  EXPECT_TRUE(at::equal(Run(20, 20, Mode::kLayerOps), alone));
  at::set_num_threads(threads);
  // A prefill in bf16 is the steps' bits: PrefillIsBitForBitTheStepsOverTheSamePositions.
}

// Score's packed path: fp32 agrees with the LibTorch forward's bits per dimension; an image's
// value does not depend on the images beside it (bits, both precisions); bf16 stays within 0.01
// bits/dim; bad subpixels and classes are refused by name.
TEST_P(CpuDecoderTest, BitsPerDimMatchTheForwardAndDoNotDependOnTheBatch) {
  const PixelModelConfig& c = model_->config();
  const int64_t n = c.seq_len(), b = 5;
  at::Tensor images = at::randint(0, 256, {b, n}, at::kLong);
  std::vector<int64_t> rows;
  at::Tensor classes;
  if (c.conditional()) {
    for (int64_t i = 0; i < b; ++i) rows.push_back(i % (c.classes + 1));
    classes = at::tensor(rows, at::kLong);
  }
  const int64_t* rows_ptr = rows.empty() ? nullptr : rows.data();
  at::NoGradGuard no_grad;
  const at::Tensor want =
      model_->NllPerImage(images, KrauseImpl::kReference, classes) / std::log(2.0);
  std::vector<Precision> precisions = {Precision::kFp32};
  if (nn::Bf16MatmulSupport().available) precisions.push_back(Precision::kBf16);
  for (Precision precision : precisions) {
    SCOPED_TRACE(PrecisionName(precision));
    decoder_ = CpuDecoder::Create(*model_, {}, precision).value();
    auto all = decoder_->BitsPerDim(images.data_ptr<int64_t>(), b, rows_ptr);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(all->size(), static_cast<size_t>(b));
    const double tolerance = precision == Precision::kFp32 ? 1e-4 : 1e-2;
    for (int64_t i = 0; i < b; ++i) {
      EXPECT_NEAR((*all)[i], want[i].item<double>(), tolerance) << "image " << i;
      auto one = decoder_->BitsPerDim(images[i].data_ptr<int64_t>(), 1,
                                      rows_ptr == nullptr ? nullptr : rows_ptr + i);
      ASSERT_TRUE(one.ok()) << one.status();
      EXPECT_EQ((*one)[0], (*all)[i]) << "image " << i << " alone";
    }
    {
      // A caller in inference mode (a benchmark, a tool) gets the same values, with the images
      // on two threads: the scratch cache's classes are set on the worker threads, which do not
      // inherit the mode.
      const int threads = at::get_num_threads();
      at::set_num_threads(2);
      const c10::InferenceMode inference;
      auto inferred = decoder_->BitsPerDim(images.data_ptr<int64_t>(), b, rows_ptr);
      at::set_num_threads(threads);
      ASSERT_TRUE(inferred.ok()) << inferred.status();
      EXPECT_EQ(*inferred, *all);
    }
  }
  images[1][3] = 256;
  EXPECT_THAT(decoder_->BitsPerDim(images.data_ptr<int64_t>(), b, rows_ptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("image 1, subpixel 3: 256 is not in [0, 255]")));
  if (c.conditional()) {
    images[1][3] = 0;
    rows[2] = c.classes + 1;
    EXPECT_THAT(decoder_->BitsPerDim(images.data_ptr<int64_t>(), b, rows.data()).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("image 2: class row")));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CpuDecoderTest, ::testing::ValuesIn(ModelCases()), ModelCaseName);

}  // namespace
}  // namespace krause
