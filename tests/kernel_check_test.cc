// The load-time kernel check (model/engine/kernel_check.h) and what it falls back to: the chain
// of implementations, the LibTorch decode step against the fused one (ties included), every
// implementation passing on healthy kernels, and the fault hook (cpu::SetCpuKernelsForTesting
// "fault_values" / "fault_throw") failing exactly the fused Krause path while the windowed one
// still passes; a decode engine on the windowed path never touches the faulty kernels.
#include "model/engine/kernel_check.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/attention/cpu_kernels.h"
#include "model/attention/decode.h"
#include "model/engine/decode_engine.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

// Restores the automatic kernel choice after each test.
class KernelCheckTest : public ::testing::Test {
 protected:
  void TearDown() override { cpu::SetCpuKernelsForTesting(nullptr); }
};

ViTConfig SmallViT(AttentionKind attention) {
  ViTConfig c;
  c.attention = attention;
  c.image_size = 8;
  c.patch = 2;  // a 4x4 grid: neighbourhoods and top-k that really select
  c.d_model = 16;
  c.depth = 2;
  c.heads = 2;
  c.mlp = 32;
  c.classes = 5;
  return c;
}

PixelModelConfig SmallGenerator(AttentionKind attention, int64_t classes) {
  PixelModelConfig c;
  c.attention = attention;
  c.height = 6;
  c.width_px = 6;
  c.channels = 1;
  c.d_model = 16;
  c.depth = 2;
  c.heads = 2;
  c.window = 8;  // 36 positions: the check's sequences wrap the ring
  c.top_k = 3;
  c.classes = classes;
  return c;
}

ServingChoice Cpu(KrauseImpl impl) { return {"cpu", impl}; }

TEST_F(KernelCheckTest, TheChainOfImplementations) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto cpu, ServingChain("cpu", KrauseImpl::kAuto));
  EXPECT_EQ(cpu,
            (std::vector<ServingChoice>{Cpu(KrauseImpl::kFusedCpu), Cpu(KrauseImpl::kWindowed)}));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto gpu, ServingChain("cuda:1", KrauseImpl::kAuto));
  EXPECT_EQ(gpu, (std::vector<ServingChoice>{{"cuda:1", KrauseImpl::kCuda},
                                             {"cuda:1", KrauseImpl::kWindowed},
                                             Cpu(KrauseImpl::kFusedCpu),
                                             Cpu(KrauseImpl::kWindowed)}));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto forced, ServingChain("cuda", KrauseImpl::kWindowed));
  EXPECT_EQ(forced, (std::vector<ServingChoice>{{"cuda", KrauseImpl::kWindowed}}));
  EXPECT_THAT(
      ServingChain("cpu", KrauseImpl::kCuda).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot serve a model on cpu")));
  EXPECT_THAT(ServingChain("cuda", KrauseImpl::kFusedCpu).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fused_cpu")));
  EXPECT_THAT(ServingChain("cpu", KrauseImpl::kReference).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reference")));
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseImpl w, ParseServingImpl("windowed"));
  EXPECT_EQ(w, KrauseImpl::kWindowed);
  EXPECT_THAT(
      ParseServingImpl("reference").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("auto, cuda, fused_cpu, windowed")));
}

// The LibTorch decode step appends and attends as the fused kernel does, step by step across the
// ring's wrap, with two sequences at different positions; on blank keys every score ties and the
// tie rule (larger position first) decides the kept set.
TEST_F(KernelCheckTest, TheLibTorchDecodeStepMatchesTheKernel) {
  for (bool blank : {false, true}) {
    SCOPED_TRACE(blank ? "blank keys (ties)" : "random keys");
    const int64_t h = 2, d = 8, w = 5, top_k = 3, steps = 12;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache a, KrauseRingCache::Create(3, h, d, w));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache b, KrauseRingCache::Create(3, h, d, w));
    at::Generator gen = at::detail::createCPUGenerator(11);
    const at::Tensor log_sigma = at::tensor({0.3f, -0.2f});
    KRAUSE_ASSERT_OK_AND_ASSIGN(DecodeScale scale, DecodeScale::Create(log_sigma, h, at::kCPU));
    const at::Tensor slots = at::tensor({2, 0}, at::kLong);
    for (int64_t t = 0; t < steps; ++t) {
      // sequence in slot 2 at position t, the one in slot 0 at t + 3 (it started earlier)
      const at::Tensor positions = at::tensor({t, t + 3}, at::kLong);
      if (t == 0) {  // slot 0's first three positions
        for (int64_t p = 0; p < 3; ++p) {
          const at::Tensor q = at::randn({1, h, d}, gen), k = at::randn({1, h, d}, gen);
          const at::Tensor v = at::randn({1, h, d}, gen);
          const at::Tensor one = at::tensor({0}, at::kLong), pos = at::tensor({p}, at::kLong);
          KRAUSE_ASSERT_OK_AND_ASSIGN(DecodeIndex i, DecodeIndex::Create(one, pos, 3, at::kCPU));
          ASSERT_TRUE(
              KrauseDecodeStep(q, blank ? at::zeros_like(k) : k, v, scale, top_k, i, &a).ok());
          ASSERT_TRUE(
              KrauseDecodeStepLibTorch(q, blank ? at::zeros_like(k) : k, v, scale, top_k, i, &b)
                  .ok());
        }
      }
      const at::Tensor q = at::randn({2, h, d}, gen), v = at::randn({2, h, d}, gen);
      const at::Tensor k = blank ? at::zeros({2, h, d}) : at::randn({2, h, d}, gen);
      KRAUSE_ASSERT_OK_AND_ASSIGN(DecodeIndex index,
                                  DecodeIndex::Create(slots, positions, 3, at::kCPU));
      KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor fused,
                                  KrauseDecodeStep(q, k, v, scale, top_k, index, &a));
      KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor libtorch,
                                  KrauseDecodeStepLibTorch(q, k, v, scale, top_k, index, &b));
      EXPECT_LE((fused - libtorch).abs().max().item<double>(), 1e-5) << "step " << t;
    }
    // The same cache contents.
    EXPECT_TRUE(at::allclose(a.values(), b.values()));
    EXPECT_TRUE(at::allclose(a.keys_t(), b.keys_t()));
    EXPECT_TRUE(at::allclose(a.bias(), b.bias(), 1e-5, 1e-6));
  }
}

TEST_F(KernelCheckTest, EveryImplementationPassesOnHealthyKernels) {
  for (AttentionKind attention : {AttentionKind::kKrause, AttentionKind::kSoftmax}) {
    SCOPED_TRACE(AttentionKindName(attention));
    KRAUSE_ASSERT_OK_AND_ASSIGN(ViT vit, ViT::Create(SmallViT(attention), 3));
    for (KrauseImpl impl : {KrauseImpl::kFusedCpu, KrauseImpl::kWindowed}) {
      const KernelCheck c = CheckClassifier(vit, vit, Cpu(impl));
      EXPECT_TRUE(c.passed()) << c.Summary();
      EXPECT_EQ(c.compared, 4 * 5);
      EXPECT_LE(c.max_abs_diff, c.tolerance);
    }
    for (int64_t classes : {0, 3}) {
      KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel gen,
                                  PixelModel::Create(SmallGenerator(attention, classes), 4));
      for (KrauseImpl impl : {KrauseImpl::kFusedCpu, KrauseImpl::kWindowed}) {
        const KernelCheck c = CheckGenerator(gen, gen, Cpu(impl));
        EXPECT_TRUE(c.passed()) << classes << " classes: " << c.Summary();
        // both sequences, every position (the ring's W + 24, at most the image), every logit
        const int64_t length =
            std::min<int64_t>(36, (attention == AttentionKind::kKrause ? 8 : 32) + 24);
        EXPECT_EQ(c.compared, 2 * length * 256);
      }
      // A KARM over bf16 rings on the CPU, at the reduced cache's tolerance; the LibTorch step
      // reads them too.
      if (attention == AttentionKind::kKrause) {
        for (KrauseImpl impl : {KrauseImpl::kFusedCpu, KrauseImpl::kWindowed}) {
          const KernelCheck c = CheckGenerator(gen, gen, Cpu(impl), at::kBFloat16);
          EXPECT_TRUE(c.passed()) << classes << " classes, bf16 rings: " << c.Summary();
          EXPECT_GT(c.max_abs_diff, 0.0);  // rounded keys and values: not the fp32 logits
        }
      }
    }
  }
  // On the CPU a generator's cache is fp32 or bf16: fp16 (GPU only) becomes fp32 there.
  EXPECT_EQ(CpuCacheDtype(at::kHalf), at::kFloat);
  EXPECT_EQ(CpuCacheDtype(at::kBFloat16), at::kBFloat16);
  EXPECT_EQ(CpuCacheDtype(at::kFloat), at::kFloat);
}

// Wrong values from the fused Krause kernels: the fused path fails with a mismatch naming where,
// the windowed path (LibTorch ops) still passes, and softmax models (no Krause kernel) pass.
TEST_F(KernelCheckTest, WrongValuesFailTheFusedPathOnly) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT vit, ViT::Create(SmallViT(AttentionKind::kKrause), 3));
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT softmax_vit, ViT::Create(SmallViT(AttentionKind::kSoftmax), 3));
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel karm,
                              PixelModel::Create(SmallGenerator(AttentionKind::kKrause, 3), 4));
  ASSERT_TRUE(cpu::SetCpuKernelsForTesting("fault_values"));

  const KernelCheck fused = CheckClassifier(vit, vit, Cpu(KrauseImpl::kFusedCpu));
  EXPECT_EQ(fused.outcome, CheckOutcome::kMismatch) << fused.Summary();
  EXPECT_GT(fused.max_abs_diff, fused.tolerance);
  EXPECT_THAT(fused.where, HasSubstr("image "));
  EXPECT_THAT(fused.Summary(), HasSubstr("fused_cpu on cpu mismatch: max |diff|"));
  EXPECT_TRUE(CheckClassifier(vit, vit, Cpu(KrauseImpl::kWindowed)).passed());
  EXPECT_TRUE(CheckClassifier(softmax_vit, softmax_vit, Cpu(KrauseImpl::kFusedCpu)).passed());

  const KernelCheck decode = CheckGenerator(karm, karm, Cpu(KrauseImpl::kFusedCpu));
  EXPECT_EQ(decode.outcome, CheckOutcome::kMismatch) << decode.Summary();
  EXPECT_THAT(decode.where, HasSubstr("sequence "));
  const KernelCheck windowed = CheckGenerator(karm, karm, Cpu(KrauseImpl::kWindowed));
  EXPECT_TRUE(windowed.passed()) << windowed.Summary();
}

TEST_F(KernelCheckTest, AThrowingKernelIsAnErrorNotACrash) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT vit, ViT::Create(SmallViT(AttentionKind::kKrause), 3));
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel karm,
                              PixelModel::Create(SmallGenerator(AttentionKind::kKrause, 0), 4));
  ASSERT_TRUE(cpu::SetCpuKernelsForTesting("fault_throw"));
  for (const KernelCheck& c : {CheckClassifier(vit, vit, Cpu(KrauseImpl::kFusedCpu)),
                               CheckGenerator(karm, karm, Cpu(KrauseImpl::kFusedCpu))}) {
    EXPECT_EQ(c.outcome, CheckOutcome::kError) << c.Summary();
    EXPECT_THAT(c.where, HasSubstr("fault injected"));
    EXPECT_EQ(c.max_abs_diff, 0);
  }
  EXPECT_TRUE(CheckClassifier(vit, vit, Cpu(KrauseImpl::kWindowed)).passed());
  EXPECT_TRUE(CheckGenerator(karm, karm, Cpu(KrauseImpl::kWindowed)).passed());
}

// An engine serving on the windowed path draws the same images with the fused kernels broken:
// its prefills, decode steps and scores never call them.
TEST_F(KernelCheckTest, AWindowedEngineNeverCallsTheFusedKernels) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel karm,
                              PixelModel::Create(SmallGenerator(AttentionKind::kKrause, 3), 4));
  const auto generate = [&]() -> std::vector<std::vector<uint8_t>> {
    EngineOptions o;
    o.max_sequences = 4;
    o.attention_impl = KrauseImpl::kWindowed;
    auto engine = DecodeEngine::Create(&karm, o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    for (int i = 0; i < 3; ++i) {
      GenerationRequest r;
      r.sampling.seed = 100 + i;
      r.label = i == 2 ? -1 : i;
      r.guidance = i == 1 ? 2.0 : 1.0;
      r.prompt = {static_cast<uint8_t>(10 * i), 7};
      EXPECT_TRUE((*engine)->Submit(r).ok());
    }
    std::vector<std::vector<uint8_t>> images;
    for (auto& [id, f] : RunUntilIdle(engine->get())) {
      EXPECT_TRUE(f.status.ok()) << f.status;
      images.push_back(f.image);
    }
    return images;
  };
  const auto healthy = generate();
  const at::Tensor images = at::randint(0, 256, {2, 36}, at::kLong);
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto healthy_bpd,
                              ScoreBitsPerDim(karm, images, {}, KrauseImpl::kWindowed));
  ASSERT_TRUE(cpu::SetCpuKernelsForTesting("fault_throw"));
  EXPECT_EQ(generate(), healthy);
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto faulty_bpd,
                              ScoreBitsPerDim(karm, images, {}, KrauseImpl::kWindowed));
  EXPECT_EQ(faulty_bpd, healthy_bpd);
  // ... while the default engine does call them, and fails cleanly.
  EXPECT_FALSE(ScoreBitsPerDim(karm, images).ok());
  EngineOptions bad;
  bad.attention_impl = KrauseImpl::kCuda;
  EXPECT_THAT(DecodeEngine::Create(&karm, bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot serve")));
}

}  // namespace
}  // namespace krause
