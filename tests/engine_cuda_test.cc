// GPU serving paths (ctest label gpu): the generators' decode engine and scoring, and the
// classifier's forward, with the model on a CUDA device, against the same model on the CPU.
// Built only with KRAUSE_WITH_CUDA; every test skips without a device.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/engine/decode_engine.h"
#include "model/engine/decode_graphs.h"
#include "model/engine/device_context.h"
#include "model/kv_cache.h"
#include "model/pixel_model.h"
#include "model/vit.h"
#include "test_util.h"

namespace krause::testing {
namespace {

PixelModelConfig SmallPixelModel(const std::string& attention) {
  PixelModelConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.height = 8;
  c.width_px = 8;
  c.channels = 3;  // 192 subpixels: the KARM ring (W 32) wraps several times
  c.d_model = 32;
  c.depth = 2;
  c.heads = 2;
  c.window = 32;
  c.top_k = 12;
  return c;
}

// The same weights on the CPU and on the GPU.
struct Pair {
  PixelModel cpu, gpu;
};

Pair MakePair(const std::string& attention) {
  PixelModel cpu = PixelModel::Create(SmallPixelModel(attention), 7).value();
  PixelModel gpu = PixelModel::Create(SmallPixelModel(attention), 7).value();
  gpu.parameters().To(at::Device(at::kCUDA));
  return {std::move(cpu), std::move(gpu)};
}

// Runs `count` requests (seeds seed0 + i; odd ones with a 10-subpixel prompt of value i when
// `prompts`) through a new engine to the end; returns the images, checks every slot is free.
// `check` sees the engine before it goes.
std::vector<std::vector<uint8_t>> Generate(
    const PixelModel& m, const EngineOptions& options, int64_t count, uint64_t seed0, bool prompts,
    const std::function<void(const DecodeEngine&)>& check = {}) {
  auto engine = DecodeEngine::Create(&m, options).value();
  std::vector<std::vector<uint8_t>> images(count);
  std::map<int64_t, int64_t> image_of;  // engine id -> i
  for (int64_t i = 0; i < count; ++i) {
    GenerationRequest r;
    r.sampling.seed = seed0 + i;
    if (prompts && i % 2 == 1) r.prompt = std::vector<uint8_t>(10, static_cast<uint8_t>(i));
    auto id = engine->Submit(std::move(r));
    EXPECT_TRUE(id.ok());
    if (id.ok()) image_of[*id] = i;
  }
  for (auto& [id, f] : RunUntilIdle(engine.get())) {
    EXPECT_TRUE(f.status.ok()) << f.status;
    images[image_of.at(id)] = std::move(f.image);
  }
  EXPECT_EQ(engine->pool().in_use(), 0);
  if (check) check(*engine);
  return images;
}

class EngineCuda : public ::testing::TestWithParam<std::string> {};

// Teacher-forced incremental decoding: prefill prompts of different lengths into different slots,
// then decode steps over all sequences at once; the GPU logits follow the CPU's.
TEST_P(EngineCuda, PrefillAndDecodeStepsMatchTheCpu) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  Pair m = MakePair(GetParam());
  const PixelModelConfig& c = m.cpu.config();
  const int64_t n = c.seq_len(), seqs = 3;
  auto cpu_cache = PixelKvCache::Create(c, 4).value();
  // Made on "cuda" (no index), as krause-check and the benchmarks name the device: the cache
  // takes its tensors' device (cuda:0), the one the model's steps are on. (The first GPU run
  // refused every ARM step here: "q must be fp32 on cuda (the cache's device)".)
  auto gpu_cache = PixelKvCache::Create(c, 4, at::Device(at::kCUDA)).value();
  for (int64_t l = 0; l < gpu_cache.layers(); ++l)
    ASSERT_EQ(gpu_cache.layer(l).device(), m.gpu.device()) << "layer " << l;
  at::manual_seed(11);
  const at::Tensor tokens = at::randint(0, 256, {seqs, n}, at::kLong);
  const std::vector<int64_t> prefix = {1, 5, 40}, slot = {3, 0, 2};
  for (int64_t s = 0; s < seqs; ++s) {
    const at::Tensor u = tokens[s].narrow(0, 0, prefix[s]);
    const at::Tensor a = m.cpu.Prefill(u, slot[s], &cpu_cache);
    const at::Tensor b = m.gpu.Prefill(u, slot[s], &gpu_cache).cpu();
    EXPECT_TRUE(at::allclose(a, b, 1e-4, 1e-4)) << "prefill " << s;
  }
  double worst = 0;
  for (int64_t step = 0; step + prefix.back() < n; ++step) {
    std::vector<int64_t> u(seqs), pos(seqs);
    for (int64_t s = 0; s < seqs; ++s) {
      pos[s] = prefix[s] + step;
      u[s] = tokens[s][pos[s]].item<int64_t>();
    }
    const at::Tensor ut = at::tensor(u, at::kLong), pt = at::tensor(pos, at::kLong),
                     st = at::tensor(slot, at::kLong);
    const at::Tensor a = m.cpu.DecodeStep(ut, pt, st, &cpu_cache);
    const at::Tensor b = m.gpu.DecodeStep(ut, pt, st, &gpu_cache);
    ASSERT_TRUE(b.is_cuda());
    worst = std::max(worst, (a - b.cpu()).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-3) << "largest logit difference over all steps";
}

// The engine on the GPU: images come out whole, prompts are kept, the same requests give the
// same images again, and every slot is free at the end.
TEST_P(EngineCuda, EngineGeneratesReproduciblyAndFreesSlots) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  Pair m = MakePair(GetParam());
  const int64_t n = m.gpu.config().seq_len();
  auto run = [&](int64_t requests) {
    return Generate(m.gpu, EngineOptions{4, 0}, requests, 100, /*prompts=*/true,
                    [](const DecodeEngine& e) { EXPECT_TRUE(e.device().is_cuda()); });
  };
  const auto first = run(6), second = run(6);
  for (int64_t i = 0; i < 6; ++i) {
    ASSERT_EQ(static_cast<int64_t>(first[i].size()), n) << i;
    EXPECT_EQ(first[i], second[i]) << "request " << i;
    if (i % 2 == 1) {
      EXPECT_EQ(std::vector<uint8_t>(first[i].begin(), first[i].begin() + 10),
                std::vector<uint8_t>(10, static_cast<uint8_t>(i)));
    }
  }
}

// CUDA graphs of the KARM decode step replay the eager step's bits (same kernels, same shapes),
// through captures for several batch sizes; the ARM gets none.
TEST_P(EngineCuda, GraphedDecodeStepsGiveTheEagerBits) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  Pair m = MakePair(GetParam());
  const bool krause = GetParam() == "krause";
  EXPECT_EQ(DecodeGraphs::Supported(m.gpu), krause);
  EXPECT_FALSE(DecodeGraphs::Supported(m.cpu));
  if (!krause) return;
  const PixelModelConfig& c = m.gpu.config();
  const at::Device dev(at::kCUDA);
  auto eager_cache = PixelKvCache::Create(c, 4, dev).value();
  auto graph_cache = PixelKvCache::Create(c, 4, dev).value();
  const PixelDecodeWeights packed = PackForDecode(m.gpu);
  DecodeGraphs graphs(&m.gpu, &graph_cache, &packed, 4);
  ASSERT_TRUE(graphs.enabled()) << graphs.reason();
  // As in the engine: the steps run on a stream of their own (captures need one).
  const DeviceContext ctx(dev);
  ctx.WaitForDefaultStream();
  const std::shared_ptr<void> scope = ctx.Enter();
  at::manual_seed(3);
  const int64_t n = c.seq_len();
  const at::Tensor tokens = at::randint(0, 256, {3, n}, at::kLong);
  const std::vector<int64_t> slot = {2, 0, 3};
  // Sequence i joins at step i, so the batch sizes run 1, 2, 3, ..., 3, 2, 1: each is captured
  // at its second step; 3 is replayed many times.
  int64_t unequal_steps = 0;
  double worst = 0;
  for (int64_t step = 0; step < n + 2; ++step) {
    std::vector<int64_t> u, pos, sl;
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t p = step - i;
      if (p < 0 || p >= n) continue;
      u.push_back(tokens[i][p].item<int64_t>());
      pos.push_back(p);
      sl.push_back(slot[i]);
    }
    const at::Tensor ut = at::tensor(u, at::kLong), pt = at::tensor(pos, at::kLong),
                     st = at::tensor(sl, at::kLong);
    const at::Tensor eager = m.gpu.DecodeStep(ut, pt, st, &eager_cache, &packed).cpu();
    const at::Tensor graphed = graphs.Step(ut, pt, st).cpu();
    ASSERT_EQ(graphed.sizes(), eager.sizes()) << "step " << step;
    if (!at::equal(eager, graphed)) ++unequal_steps;
    worst = std::max(worst, (eager - graphed).abs().max().item<double>());
  }
  EXPECT_EQ(unequal_steps, 0) << "steps whose graphed logits differ from the eager ones";
  EXPECT_LT(worst, 1e-4) << "largest logit difference";
  EXPECT_TRUE(graphs.enabled()) << graphs.reason();
  EXPECT_EQ(graphs.graphs(), 3);
  EXPECT_GT(graphs.replays(), n - 10);
  for (int64_t l = 0; l < c.depth; ++l) {
    const std::vector<at::Tensor> eager = eager_cache.layer(l).Storage();
    const std::vector<at::Tensor> graphed = graph_cache.layer(l).Storage();
    ASSERT_EQ(eager.size(), graphed.size());
    for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(at::equal(eager[i], graphed[i])) << l;
  }
}

// The engine with graphs gives the images of the engine without (same requests, same order).
TEST_P(EngineCuda, EngineWithGraphsGivesTheSameImages) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  Pair m = MakePair(GetParam());
  auto run = [&](bool graphs) {
    return Generate(m.gpu, EngineOptions{4, 0, graphs}, 6, 300, false, [&](const DecodeEngine& e) {
      EXPECT_EQ(e.graphs() != nullptr, graphs && GetParam() == "krause");
      if (e.graphs() != nullptr) {
        EXPECT_TRUE(e.graphs()->enabled()) << e.graphs()->reason();
        EXPECT_GT(e.graphs()->replays(), 0);
      }
    });
  };
  const auto eager = run(false), graphed = run(true);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(eager[i], graphed[i]) << "request " << i;
  // And over bf16 ring caches (KARM).
  if (GetParam() == "krause") {
    EngineOptions o{4, 0, false};
    o.cache_dtype = at::kBFloat16;
    const auto eager16 = Generate(m.gpu, o, 4, 700, false);
    o.cuda_graphs = true;
    const auto graphed16 = Generate(m.gpu, o, 4, 700, false);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(eager16[i], graphed16[i]) << "bf16 request " << i;
  }
}

// A KARM engine with bf16 ring caches: whole, reproducible images, every slot freed; its decode
// logits stay near the fp32 cache's (own tolerance: keys and values rounded to 8 bits of
// mantissa).
TEST_P(EngineCuda, Bf16CachesGenerateAndStayNearFp32) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  Pair m = MakePair(GetParam());
  EngineOptions o{4, 0};
  o.cache_dtype = at::kBFloat16;
  if (GetParam() != "krause") {
    EXPECT_FALSE(DecodeEngine::Create(&m.gpu, o).ok());
    return;
  }
  const int64_t n = m.gpu.config().seq_len();
  auto run = [&] { return Generate(m.gpu, o, 3, 500, false); };
  const auto first = run(), second = run();
  for (int64_t i = 0; i < 3; ++i) {
    ASSERT_EQ(static_cast<int64_t>(first[i].size()), n);
    EXPECT_EQ(first[i], second[i]) << i;
  }
  // Teacher-forced steps, fp32 and bf16 caches side by side.
  const PixelModelConfig& c = m.gpu.config();
  auto f32 = PixelKvCache::Create(c, 2, at::Device(at::kCUDA)).value();
  auto b16 = PixelKvCache::Create(c, 2, at::Device(at::kCUDA), at::kBFloat16).value();
  at::manual_seed(2);
  const at::Tensor tokens = at::randint(0, 256, {n}, at::kLong);
  (void)m.gpu.Prefill(tokens.narrow(0, 0, 5), 1, &f32);
  (void)m.gpu.Prefill(tokens.narrow(0, 0, 5), 1, &b16);
  double worst = 0;
  for (int64_t p = 5; p < n; ++p) {
    const at::Tensor u = tokens.narrow(0, p, 1), pos = at::full({1}, p, at::kLong),
                     slot = at::full({1}, 1, at::kLong);
    const at::Tensor a = m.gpu.DecodeStep(u, pos, slot, &f32).cpu();
    const at::Tensor b = m.gpu.DecodeStep(u, pos, slot, &b16).cpu();
    worst = std::max(worst, (a - b).abs().max().item<double>());
  }
  EXPECT_LT(worst, 0.05) << "largest logit difference, bf16 vs fp32 ring caches";
}

TEST_P(EngineCuda, ScoringMatchesTheCpu) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  Pair m = MakePair(GetParam());
  at::manual_seed(5);
  const at::Tensor images = at::randint(0, 256, {3, m.cpu.config().seq_len()}, at::kLong);
  const auto a = ScoreBitsPerDim(m.cpu, images).value();
  const auto b = ScoreBitsPerDim(m.gpu, images).value();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * a[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Models, EngineCuda, ::testing::Values("krause", "softmax"));

// The classifier end to end: a small random ViT's logits on the GPU (kAuto: the CUDA kernels,
// with gradients off) are the CPU's (kAuto: the fused CPU kernel), within 1e-4 relative to the
// logit scale. 4x4 patches + CLS (17 tokens), and 16x16 patches + CLS (257 tokens: the CLS row
// has 257 candidates, so the block kernel runs it while the warp kernel runs the patch rows).
// Each layer has its own sigma, a [1] log_sigma broadcast to the heads as the ViT passes it.
// Catches what the attention tests cannot see: the ViT's glue on a GPU (a per-layer scalar
// log_sigma, head splitting, the CLS token, the grid the model builds) and a device fallback
// that changes the result. The softmax baseline runs the same way (no Krause kernel).
TEST(ViTCuda, ForwardOnTheGpuGivesTheCpuLogits) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const at::Device dev(at::kCUDA);
  struct Shape {
    int64_t image, patch, channels;
    GridMetric metric;
  };
  for (const std::string attention : {"krause", "softmax"}) {
    for (const Shape& s :
         {Shape{12, 3, 1, GridMetric::kManhattan}, Shape{32, 2, 3, GridMetric::kChebyshev}}) {
      SCOPED_TRACE(absl::StrCat(attention, " ", s.image, "/", s.patch));
      ViTConfig cfg;
      cfg.attention = ParseAttentionKind(attention).value();
      cfg.image_size = s.image;
      cfg.patch = s.patch;
      cfg.channels = s.channels;
      cfg.d_model = 48;
      cfg.heads = 3;
      cfg.depth = 2;
      cfg.mlp = 72;
      cfg.classes = 7;
      cfg.radius = 1;
      cfg.metric = s.metric;
      cfg.top_k = 2;
      cfg.cls = true;
      auto make = [&]() -> ViT {
        ViT m = ViT::Create(cfg, 4).value();
        at::NoGradGuard no_grad;
        for (int64_t l = 0; l < cfg.depth; ++l) {
          const std::string name = absl::StrCat("blocks.", l, ".attention.log_sigma");
          if (m.parameters().Has(name)) m.parameters().Get(name).fill_(0.4 + 0.5 * l);
        }
        return m;
      };
      const ViT cpu = make();
      ViT gpu = make();
      gpu.parameters().To(dev);
      at::Generator gen = at::detail::createCPUGenerator(8);
      const at::Tensor images = GaussianTensor({4, s.channels, s.image, s.image}, 1.0, gen);
      at::NoGradGuard no_grad;
      const at::Tensor want = cpu.Forward(images);
      const at::Tensor got = gpu.Forward(images.to(dev));
      ASSERT_TRUE(got.is_cuda());
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_TRUE(at::isfinite(got).all().item<bool>());
      EXPECT_LE(RelativeMaxError(got.cpu(), want), 1e-4);
      if (cfg.attention == AttentionKind::kKrause) {
        // kCuda forced: the kernels take every layer (no fallback hides behind kAuto).
        EXPECT_LE(RelativeMaxError(gpu.Forward(images.to(dev), KrauseImpl::kCuda).cpu(), want),
                  1e-4);
      }
    }
  }
}

}  // namespace
}  // namespace krause::testing
