// The packed CPU decode step (CpuDecoder) and the sampler's fast ranking:
//   - PlanCpuStep's decisions, exactly, for the shapes that matter;
//   - every plan mode (inline, sequence blocks, layer ops), every CPU kernel variant and every
//     batch composition give a sequence the same logits, bit for bit, and they match the LibTorch
//     reference step (PixelModel::DecodeStep without packed weights) within 1e-4;
//   - bfloat16 linear weights (ParameterStore::RoundLinear): the packed step on half the bytes has
//     the bits of the fp32 packed step on the rounded weights, in every variant and plan mode; the
//     linear kernel alone likewise at odd shapes;
//   - bad slots, positions and tokens are refused by name and leave the cache unchanged;
//   - SamplePixel draws exactly what SamplePixelReference draws.
#include "model/engine/cpu_decoder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "model/attention/cpu_kernels.h"
#include "model/engine/sampling.h"
#include "model/kv_cache.h"
#include "model/nn/dnnl_linear.h"
#include "model/nn/packed.h"
#include "model/pixel_model.h"
#include "model/precision.h"
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

struct ModelCase {
  const char* attention;
  bool start;
  int64_t classes;          // > 0: class-conditional
  bool class_norm = false;  // per-class LayerNorm scale and shift
};

void PrintTo(const ModelCase& c, std::ostream* os) {
  *os << c.attention << (c.start ? " start" : " no start") << ", classes " << c.classes
      << (c.class_norm ? ", class_norm" : "");
}

PixelModelConfig Config(const std::string& attention, bool start, int64_t classes = 0,
                        bool class_norm = false) {
  PixelModelConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.height = 6;
  c.width_px = 5;
  c.channels = 2;  // 60 tokens: a window of 12 wraps several times
  c.d_model = 48;  // 3 * 48 = 144 fused q/k/v columns; MLP 192
  c.depth = 2;
  c.heads = 3;  // head dim 16
  c.window = 12;
  c.top_k = 7;
  c.start_token = start;
  c.classes = classes;
  c.class_norm = class_norm;
  return c;
}

class CpuDecoderTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    auto m = PixelModel::Create(
        Config(GetParam().attention, GetParam().start, GetParam().classes, GetParam().class_norm),
        21);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<PixelModel>(std::move(*m));
    at::NoGradGuard g;
    for (auto& [name, t] : model_->parameters().items()) {
      if (name.find("log_sigma") != std::string::npos) {
        t.copy_(at::linspace(-0.4, 0.8, t.numel()).view(t.sizes()));
      } else if (name.find("bias") != std::string::npos || name.find("ln") != std::string::npos) {
        t.add_(at::randn(t.sizes()) * 0.1);  // non-trivial biases and norms (class_norm's too)
      } else if (name == "class_emb.weight") {
        t.mul_(25);  // classes that change the logits clearly
      }
    }
    auto dec = CpuDecoder::Create(*model_);
    ASSERT_TRUE(dec.ok()) << dec.status();
    decoder_ = std::move(*dec);
  }

  // Runs `seqs` sequences (sequence i starts at step i % 3, in slot seqs - 1 - i) through the
  // whole image, `group` sequences per Step call, and returns logits [seqs, N, 256].
  // A conditional model: sequence i runs with class row (i + class_shift) % (classes + 1) (the
  // null class included).
  at::Tensor Run(int64_t seqs, int64_t group, std::optional<Mode> mode, bool reference = false,
                 int64_t class_shift = 0) {
    const PixelModelConfig& c = model_->config();
    const int64_t n = c.seq_len();
    auto cache = PixelKvCache::Create(c, seqs).value();
    if (c.conditional()) {
      for (int64_t i = 0; i < seqs; ++i)
        cache.SetClass(seqs - 1 - i, (i + class_shift) % (c.classes + 1));
    }
    at::Tensor out = at::zeros({seqs, n, 256});
    std::mt19937 rng(5);
    std::vector<std::vector<int64_t>> tokens(seqs);
    for (auto& t : tokens) {
      t.push_back(c.start_token ? PixelModel::kStartToken : 17);
      for (int64_t p = 1; p < n; ++p) t.push_back(static_cast<int64_t>(rng() % 256));
    }
    std::vector<int64_t> next(seqs, 0);
    at::NoGradGuard no_grad;
    for (int64_t step = 0;; ++step) {
      std::vector<int64_t> rows, u, pos, slot;
      for (int64_t i = 0; i < seqs; ++i) {
        if (step < i % 3 || next[i] >= n) continue;
        rows.push_back(i);
        u.push_back(tokens[i][next[i]]);
        pos.push_back(next[i]);
        slot.push_back(seqs - 1 - i);
      }
      if (rows.empty()) break;
      for (size_t g0 = 0; g0 < rows.size(); g0 += group) {
        const int64_t g = std::min<int64_t>(group, static_cast<int64_t>(rows.size() - g0));
        at::Tensor logits;
        if (reference) {
          logits = model_->DecodeStep(
              at::tensor(std::vector<int64_t>(u.begin() + g0, u.begin() + g0 + g)),
              at::tensor(std::vector<int64_t>(pos.begin() + g0, pos.begin() + g0 + g)),
              at::tensor(std::vector<int64_t>(slot.begin() + g0, slot.begin() + g0 + g)), &cache);
        } else {
          logits = at::empty({g, 256});
          const absl::Status st = decoder_->Step(&u[g0], &pos[g0], &slot[g0], g, &cache,
                                                 logits.data_ptr<float>(), mode);
          EXPECT_TRUE(st.ok()) << st;
        }
        for (int64_t r = 0; r < g; ++r) out[rows[g0 + r]][pos[g0 + r]].copy_(logits[r]);
      }
      for (int64_t i : rows) ++next[i];
    }
    return out;
  }

  std::unique_ptr<PixelModel> model_;
  std::unique_ptr<CpuDecoder> decoder_;
};

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

INSTANTIATE_TEST_SUITE_P(
    Models, CpuDecoderTest,
    ::testing::Values(ModelCase{"krause", true, 0}, ModelCase{"krause", false, 0},
                      ModelCase{"softmax", true, 0}, ModelCase{"krause", true, 4},
                      ModelCase{"softmax", true, 4}, ModelCase{"krause", true, 4, true},
                      ModelCase{"softmax", true, 4, true}),
    [](const auto& info) {
      return std::string(info.param.attention) + (info.param.start ? "_start" : "_nostart") +
             (info.param.classes > 0 ? "_conditional" : "") +
             (info.param.class_norm ? "_class_norm" : "");
    });

TEST(CpuKernels, GeluMatchesTheErfFormulaInEveryVariant) {
  // Lengths with and without a tail of fewer than 8; values across the whole useful range.
  for (int v = 0; v < cpu::NumCpuKernelVariants(); ++v) {
    ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(v)));
    for (int64_t n : {1, 7, 8, 13, 128, 1027}) {
      std::vector<float> x(n), y(n);
      for (int64_t i = 0; i < n; ++i) x[i] = -12.0f + 24.0f * static_cast<float>(i) / n;
      cpu::CpuKernels().gelu(x.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double want = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
        ASSERT_NEAR(y[i], want, 2e-6 * std::max(1.0, std::abs(static_cast<double>(x[i]))))
            << cpu::CpuKernelVariantName(v) << " x " << x[i];
      }
    }
  }
  cpu::SetCpuKernelsForTesting(nullptr);
}

TEST(CpuKernels, Bf16LinearWeightsGiveTheFp32KernelsBitsOnTheRoundedWeights) {
  // Row counts through every row group (6, 4, 1) and tail; widths with a padded last chunk.
  at::manual_seed(9);
  for (int64_t in : {1, 7, 48, 129}) {
    for (int64_t out : {5, 16, 33}) {
      const at::Tensor w = at::randn({out, in}) * 0.3, b = at::randn({out});
      const at::Tensor rounded = w.to(at::kBFloat16).to(at::kFloat);
      const nn::PackedLinear half = nn::PackLinear({w}, {b}, cpu::Elem::kBFloat16);
      const nn::PackedLinear full = nn::PackLinear({rounded}, {b});
      ASSERT_TRUE(half.wt.empty());
      ASSERT_EQ(half.wt16.size(), full.wt.size());
      for (int v = 0; v < cpu::NumCpuKernelVariants(); ++v) {
        ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(v)));
        for (int64_t rows : {1, 3, 4, 6, 11, 13}) {
          SCOPED_TRACE(::testing::Message() << cpu::CpuKernelVariantName(v) << " in " << in
                                            << " out " << out << " rows " << rows);
          const at::Tensor x = at::randn({rows, in});
          std::vector<float> got(rows * half.out_pad), want(rows * full.out_pad);
          half.Apply(x.data_ptr<float>(), rows, got.data());
          full.Apply(x.data_ptr<float>(), rows, want.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
          // And it is the layer: within fp32 rounding of x W^T + b in double.
          const at::Tensor exact =
              at::linear(x.to(at::kDouble), rounded.to(at::kDouble), b.to(at::kDouble));
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < out; ++j)
              ASSERT_NEAR(got[r * half.out_pad + j], exact[r][j].item<double>(), 1e-4);
        }
      }
    }
  }
  cpu::SetCpuKernelsForTesting(nullptr);
}

// The avx512 variant (512-bit linear tiles, 16-wide GELU) gives the avx2 variant's bits: the same
// multiply-adds in the same order per element. Linear rows through every tile (12, 4, 1 rows; two
// chunks and one), fp32 and bf16 weights; GELU; the table prefill and the dense softmax.
TEST(CpuKernels, TheAvx512VariantGivesTheAvx2VariantsBits) {
  if (cpu::NumCpuKernelVariants() < 3) GTEST_SKIP() << "this CPU or build has no avx512 variant";
  ASSERT_STREQ(cpu::CpuKernelVariantName(1), "avx2");
  ASSERT_STREQ(cpu::CpuKernelVariantName(2), "avx512");
  at::manual_seed(11);
  // What `run` writes under each variant, compared bit for bit.
  auto same = [](const std::function<std::vector<float>()>& run) {
    std::vector<float> got[2];
    for (int v : {1, 2}) {
      EXPECT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(v)));
      got[v - 1] = run();
    }
    cpu::SetCpuKernelsForTesting(nullptr);
    return got[0].size() == got[1].size() &&
           std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)) == 0;
  };
  for (int64_t in : {1, 7, 48, 129, 384}) {
    for (int64_t out : {5, 16, 33, 48, 80}) {
      const at::Tensor w = at::randn({out, in}) * 0.3, b = at::randn({out});
      for (cpu::Elem elem : {cpu::Elem::kFloat32, cpu::Elem::kBFloat16}) {
        const nn::PackedLinear l = nn::PackLinear({w}, {b}, elem);
        for (int64_t rows : {1, 3, 4, 11, 12, 13, 17, 29}) {
          const at::Tensor x = at::randn({rows, in});
          EXPECT_TRUE(same([&] {
            std::vector<float> o(rows * l.out_pad);
            l.Apply(x.data_ptr<float>(), rows, o.data());
            // and a chunk range that starts on an odd chunk
            if (l.chunks() > 2) l.Apply(x.data_ptr<float>(), rows, o.data(), 1, l.chunks());
            return o;
          })) << "in "
              << in << " out " << out << " rows " << rows << " bf16 "
              << (elem == cpu::Elem::kBFloat16);
        }
      }
    }
  }
  for (int64_t n : {1, 8, 15, 16, 17, 40, 1027}) {
    const at::Tensor x = at::randn({n}) * 4;
    EXPECT_TRUE(same([&] {
      std::vector<float> y(n);
      cpu::CpuKernels().gelu(x.data_ptr<float>(), n, y.data());
      return y;
    })) << "gelu n "
        << n;
  }
  // Dense (not causal) softmax attention over n keys.
  for (int64_t n : {5, 50, 197}) {
    const int64_t d = 64, stride = cpu::RoundUpToChunk(n);
    const at::Tensor q = at::randn({n, d}), k = at::randn({n, d}), v = at::randn({n, d});
    at::Tensor kt = at::zeros({d, stride});
    kt.narrow(1, 0, n).copy_(k.t());
    EXPECT_TRUE(same([&] {
      std::vector<float> out(n * d), lse(n), scratch(cpu::SoftmaxScratchFloats(n));
      cpu::SoftmaxSlice s{};
      s.q = q.data_ptr<float>();
      s.k = k.data_ptr<float>();
      s.kt = kt.data_ptr<float>();
      s.v = v.data_ptr<float>();
      s.scale = 0.125f;
      s.n = n;
      s.d = d;
      s.stride = stride;
      s.out = out.data();
      s.lse = lse.data();
      s.causal = false;
      cpu::CpuKernels().softmax_forward(s, 0, n, scratch.data());
      return out;
    })) << "softmax n "
        << n;
  }
}

TEST(SamplePixel, DrawsWhatTheReferenceDraws) {
  std::mt19937 rng(3);
  std::vector<float> logits(256);
  int64_t cases = 0;
  for (int round = 0; round < 300; ++round) {
    // Logit families: spread, few distinct values (ties), signed zeros, one dominant value.
    for (int i = 0; i < 256; ++i) {
      switch (round % 4) {
        case 0:
          logits[i] = std::normal_distribution<float>(0, 3)(rng);
          break;
        case 1:
          logits[i] = static_cast<float>(static_cast<int>(rng() % 5) - 2);
          break;
        case 2:
          logits[i] = rng() % 2 ? 0.0f : -0.0f;
          if (rng() % 8 == 0) logits[i] = std::ldexp(1.0f, -(static_cast<int>(rng() % 30)));
          break;
        default:
          logits[i] = i == static_cast<int>(round % 256) ? 12.0f : -static_cast<float>(rng() % 7);
      }
    }
    for (double temperature : {0.0, 0.7, 1.0, 1.8}) {
      for (int64_t top_k : {0, 1, 5, 256}) {
        for (double top_p : {1.0, 0.9, 0.3}) {
          SamplingParams p;
          p.temperature = temperature;
          p.top_k = top_k;
          p.top_p = top_p;
          p.seed = rng();
          const uint64_t index = rng() % 784;
          ASSERT_EQ(SamplePixel(logits.data(), p, index),
                    SamplePixelReference(logits.data(), p, index))
              << "round " << round << " T " << temperature << " k " << top_k << " p " << top_p;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 300 * 4 * 4 * 3);
}

}  // namespace
}  // namespace krause
