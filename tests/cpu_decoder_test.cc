// The packed CPU decode step (CpuDecoder):
//   - PlanCpuStep's decisions, exactly, for the shapes that matter;
//   - every plan mode (inline, sequence blocks, layer ops), every CPU kernel variant and every
//     batch composition give a sequence the same logits, bit for bit, and they match the LibTorch
//     reference step (PixelModel::DecodeStep without packed weights) within 1e-4;
//   - bfloat16 linear weights (ParameterStore::RoundLinear): the packed step on half the bytes has
//     the bits of the fp32 packed step on the rounded weights, in every variant and plan mode;
//   - a sequence's class changes its logits only; the layer ops split every op over the threads;
//   - bad slots, positions and tokens are refused by name and leave the cache unchanged.
// The prefill, bf16 precision and the bits per dimension: cpu_decoder_prefill_test.cc; the
// kernels alone and the sampler's fast ranking: cpu_kernels_test.cc.
#include "model/engine/cpu_decoder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <vector>

#include "model/attention/cpu_kernels.h"
#include "model/kv_cache.h"
#include "model/pixel_model.h"
#include "tests/cpu_decoder_test.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;
using Mode = CpuStepPlan::Mode;

TEST(PlanCpuStep, InlineUnlessEachTaskGetsEnoughWork) {
  const CpuStepTuning t;  // 1 MFLOP per task, weights up to 512 KiB stay cache-resident
  // The bundled KARM: ~0.18 MFLOP per sequence, 0.33 MB of weights.
  const CpuStepShape small{1, 0.18e6, 330000, 2};
  EXPECT_EQ(PlanCpuStep(small, t).mode, Mode::kInline);
  CpuStepShape s = small;
  s.sequences = 11;  // 1.98 MFLOP: a second task would get less than 1 MFLOP
  EXPECT_EQ(PlanCpuStep(s, t).mode, Mode::kInline);
  s.sequences = 12;  // 2.16 MFLOP: two tasks of 6 (below 16: not rounded to row groups)
  EXPECT_EQ(PlanCpuStep(s, t).mode, Mode::kSequenceBlocks);
  EXPECT_EQ(PlanCpuStep(s, t).block, 6);
  s.sequences = 64;  // two tasks of 32
  EXPECT_EQ(PlanCpuStep(s, t).mode, Mode::kSequenceBlocks);
  EXPECT_EQ(PlanCpuStep(s, t).block, 32);
  s.sequences = 63;  // 32 rounded to the row group of 4: 32 + 31
  EXPECT_EQ(PlanCpuStep(s, t).block, 32);
  s.sequences = 22;  // 11 + 11
  EXPECT_EQ(PlanCpuStep(s, t).block, 11);
  s.sequences = 34;  // 17 rounded to 20: 20 + 14
  EXPECT_EQ(PlanCpuStep(s, t).block, 20);
  s.threads = 4;  // four tasks of 16 for 64 sequences
  s.sequences = 64;
  EXPECT_EQ(PlanCpuStep(s, t).block, 16);
  s.threads = 1;  // one thread: always inline
  EXPECT_EQ(PlanCpuStep(s, t).mode, Mode::kInline);
  // Large weights (the paper's MNIST KARM, ~19 MFLOP and 38 MB): op by op, even for one sequence.
  const CpuStepShape paper{1, 19e6, 38 << 20, 2};
  EXPECT_EQ(PlanCpuStep(paper, t).mode, Mode::kLayerOps);
}

TEST_P(CpuDecoderTest, EveryModeKernelAndBatchGivesTheSameBitsAndMatchesTheReference) {
  const int64_t seqs = 9;
  const at::Tensor reference = Run(seqs, seqs, std::nullopt, /*reference=*/true);
  const at::Tensor alone = Run(seqs, 1, Mode::kInline);
  EXPECT_LE((alone - reference).abs().max().item<double>(), 1e-4)
      << "packed step vs the LibTorch reference step";
  for (int v = 0; v < cpu::NumCpuKernelVariants(); ++v) {
    ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(v)));
    const at::Tensor variant_alone = Run(seqs, 1, Mode::kInline);
    for (Mode mode : {Mode::kInline, Mode::kSequenceBlocks, Mode::kLayerOps}) {
      for (int64_t group : {seqs, int64_t{4}}) {
        SCOPED_TRACE(::testing::Message() << cpu::CpuKernelVariantName(v) << " mode "
                                          << static_cast<int>(mode) << " group " << group);
        EXPECT_TRUE(at::equal(Run(seqs, group, mode), variant_alone));
      }
    }
    // Variants differ in instructions (FMA), not in the model: close, not equal.
    EXPECT_LE((variant_alone - alone).abs().max().item<double>(), 1e-4);
  }
  cpu::SetCpuKernelsForTesting(nullptr);
}

TEST_P(CpuDecoderTest, Bf16WeightsGiveTheBitsOfFp32WeightsRounded) {
  const int64_t seqs = 5;
  const at::Tensor fp32 = Run(seqs, seqs, Mode::kInline);
  const int64_t fp32_bytes = decoder_->weight_bytes();
  ASSERT_TRUE(model_->parameters().RoundLinear(at::kBFloat16).ok());
  decoder_ = CpuDecoder::Create(*model_).value();
  EXPECT_LT(decoder_->weight_bytes(), fp32_bytes * 6 / 10) << "bf16 blocks: about half the bytes";
  // Not compared with the LibTorch step here: that step's projections are BLAS GEMMs, and with
  // these rounded weights one selection is a near-tie that another BLAS kernel (Prescott) decides
  // the other way (5e-3 in a logit). The fp32 packed step's agreement with the reference is the
  // test above's; this one holds the bf16 step to the fp32 packed step's bits, BLAS-free.
  const at::Tensor bf16 = Run(seqs, seqs, Mode::kInline);
  EXPECT_GT((bf16 - fp32).abs().max().item<double>(), 1e-5) << "the rounding changed nothing";
  // The rounded values, packed as fp32 (RoundLinear(kFloat) keeps the values): the same bits.
  ASSERT_TRUE(model_->parameters().RoundLinear(at::kFloat).ok());
  std::unique_ptr<CpuDecoder> fp32_rounded = CpuDecoder::Create(*model_).value();
  EXPECT_EQ(fp32_rounded->weight_bytes(), fp32_bytes);
  for (int v = 0; v < cpu::NumCpuKernelVariants(); ++v) {
    ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(v)));
    SCOPED_TRACE(cpu::CpuKernelVariantName(v));
    std::swap(decoder_, fp32_rounded);
    const at::Tensor want = Run(seqs, 1, Mode::kInline);
    std::swap(decoder_, fp32_rounded);
    for (Mode mode : {Mode::kInline, Mode::kSequenceBlocks, Mode::kLayerOps}) {
      EXPECT_TRUE(at::equal(Run(seqs, seqs, mode), want)) << static_cast<int>(mode);
    }
  }
  cpu::SetCpuKernelsForTesting(nullptr);
}

TEST_P(CpuDecoderTest, ASequencesClassChangesItsLogitsOnlyAndTheReferenceAgrees) {
  if (!model_->config().conditional()) GTEST_SKIP() << "unconditional";
  const int64_t seqs = 8, rows = model_->config().classes + 1;
  const at::Tensor a = Run(seqs, seqs, std::nullopt);
  const at::Tensor shifted = Run(seqs, seqs, std::nullopt, false, 1);
  const at::Tensor reference = Run(seqs, seqs, std::nullopt, true, 1);
  EXPECT_LE((shifted - reference).abs().max().item<double>(), 1e-4);
  // Sequence i has class row i % rows in `a` and (i + 1) % rows in `shifted`, same tokens.
  for (int64_t i = 0; i < seqs; ++i) EXPECT_FALSE(at::allclose(a[i], shifted[i])) << i;
  // A full cycle of shifts brings every sequence back to its class and its bits.
  EXPECT_TRUE(at::equal(Run(seqs, seqs, std::nullopt, false, rows), a));
}

TEST_P(CpuDecoderTest, LayerOpsSplitEveryOpOverTheThreadsAndKeepTheBits) {
  // With a tiny task size every op of kLayerOps really runs in parallel pieces, and the plan
  // picks sequence blocks of one row group.
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const at::Tensor one_by_one = Run(6, 1, Mode::kInline);
  CpuStepTuning tiny;
  tiny.min_task_flops = 1;
  auto dec = CpuDecoder::Create(*model_, tiny);
  ASSERT_TRUE(dec.ok()) << dec.status();
  decoder_ = std::move(*dec);
  EXPECT_EQ(decoder_->Plan(8).mode, Mode::kSequenceBlocks);
  EXPECT_EQ(decoder_->Plan(8).block, 4);
  EXPECT_TRUE(at::equal(Run(6, 6, Mode::kLayerOps), one_by_one));
  EXPECT_TRUE(at::equal(Run(6, 6, std::nullopt), one_by_one));
  at::set_num_threads(threads);
}

TEST_P(CpuDecoderTest, BadEntriesAreRefusedByNameAndChangeNothing) {
  const PixelModelConfig& c = model_->config();
  auto cache = PixelKvCache::Create(c, 3).value();
  // Values are the second storage tensor of both kinds (kv_cache.h).
  const at::Tensor before = cache.layer(0).Storage()[1].clone();
  std::vector<float> logits(3 * 256);
  auto step = [&](std::vector<int64_t> u, std::vector<int64_t> pos, std::vector<int64_t> slots) {
    return decoder_->Step(u.data(), pos.data(), slots.data(), static_cast<int64_t>(u.size()),
                          &cache, logits.data());
  };
  EXPECT_THAT(step({1, 2}, {0, 0}, {1, 1}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     HasSubstr("slots[1] = 1 appears twice")));
  EXPECT_THAT(step({1, 2}, {0, 0}, {0, 3}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     HasSubstr("slots[1] = 3 is outside [0, 3)")));
  EXPECT_THAT(step({1, 2}, {0, c.seq_len()}, {0, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positions[1] = 60")));
  EXPECT_THAT(step({1, 300}, {0, 1}, {0, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("u[1] = 300")));
  if (!c.start_token) {
    EXPECT_THAT(step({PixelModel::kStartToken}, {0}, {0}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("u[0] = 256")));
  }
  const at::Tensor after = cache.layer(0).Storage()[1];
  EXPECT_TRUE(at::equal(before, after));
  // Another model's cache.
  PixelModelConfig other = c;
  other.attention =
      c.attention == AttentionKind::kKrause ? AttentionKind::kSoftmax : AttentionKind::kKrause;
  auto wrong = PixelKvCache::Create(other, 3).value();
  int64_t u = 1, p = 0, s = 0;
  EXPECT_THAT(decoder_->Step(&u, &p, &s, 1, &wrong, logits.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another kind of model")));
  // A cache with (or without) classes the decoder does not have.
  PixelModelConfig flipped = c;
  flipped.classes = c.conditional() ? 0 : 2;
  auto other_classes = PixelKvCache::Create(flipped, 3).value();
  EXPECT_THAT(decoder_->Step(&u, &p, &s, 1, &other_classes, logits.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("class conditioning")));
}

INSTANTIATE_TEST_SUITE_P(Models, CpuDecoderTest, ::testing::ValuesIn(ModelCases()), ModelCaseName);

}  // namespace
}  // namespace krause
