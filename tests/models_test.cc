// Krause ViT, KARM and their softmax baselines: layouts, configs, the training (windowed) vs
// inference (fused) forward parity, causality, and checkpoint round trips.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "model/checkpoint/safetensors.h"
#include "model/kv_cache.h"
#include "model/nn/layers.h"
#include "model/pixel_model.h"
#include "model/vit.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::RelativeMaxError;
using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

ViTConfig SmallViT(const std::string& attention) {
  ViTConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.image_size = 12;
  c.patch = 3;
  c.d_model = 32;
  c.depth = 3;
  c.heads = 4;
  c.mlp = 48;
  c.top_k = 2;
  return c;
}

PixelModelConfig SmallPixelModel(const std::string& attention, bool start) {
  PixelModelConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.height = 5;
  c.width_px = 6;
  c.d_model = 32;
  c.depth = 2;
  c.heads = 4;
  c.window = 7;
  c.top_k = 4;
  c.start_token = start;
  return c;
}

TEST(ViT, TopKScheduleMatchesTheOfficialCifarModel) {
  ViTConfig c;
  c.depth = 12;
  c.top_k = 2;
  EXPECT_EQ(c.TopKSchedule(), (std::vector<int64_t>{2, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4}));
}

TEST(ViT, OfficialParameterNames) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT m, ViT::Create(SmallViT("krause"), 1));
  for (const char* name :
       {"patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.0.attention.W_q.weight",
        "blocks.2.attention.log_sigma", "blocks.1.ffn.3.bias", "norm.weight", "head.bias"}) {
    EXPECT_TRUE(m.parameters().Has(name)) << name;
  }
  EXPECT_EQ(m.parameters().Get("pos_embed").sizes(), (std::vector<int64_t>{1, 17, 32}));
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT s, ViT::Create(SmallViT("softmax"), 1));
  EXPECT_FALSE(s.parameters().Has("blocks.0.attention.log_sigma"));
  // Same backbone: only log_sigma differs.
  EXPECT_EQ(m.parameters().NumParameters() - s.parameters().NumParameters(), 3);
}

TEST(ViT, TrainingAndInferenceForwardAgree) {
  for (bool cls : {true, false}) {
    ViTConfig c = SmallViT("krause");
    c.cls = cls;
    c.metric = cls ? GridMetric::kManhattan : GridMetric::kChebyshev;
    KRAUSE_ASSERT_OK_AND_ASSIGN(ViT m, ViT::Create(c, 3));
    const at::Tensor x = at::randn({5, 1, 12, 12});
    at::NoGradGuard no_grad;
    const at::Tensor train = m.Forward(x, KrauseImpl::kWindowed);
    const at::Tensor infer = m.Forward(x, KrauseImpl::kFusedCpu);
    const at::Tensor ref = m.Forward(x, KrauseImpl::kReference);
    EXPECT_EQ(infer.sizes(), (std::vector<int64_t>{5, 10}));
    EXPECT_LE(RelativeMaxError(train, ref), 1e-5);
    EXPECT_LE(RelativeMaxError(infer, ref), 1e-5);
  }
}

TEST(ViT, ConfigJsonRoundTripAndValidation) {
  ViTConfig c = SmallViT("krause");
  c.labels = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViTConfig back, ViTConfig::FromJson(c.ToJson()));
  EXPECT_EQ(back.ToJson(), c.ToJson());
  c.patch = 5;
  EXPECT_THAT(ViTConfig::FromJson(c.ToJson()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple of patch")));
  EXPECT_THAT(ViTConfig::FromJson("[1]").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("JSON")));
}

TEST(ViT, CheckpointRoundTripReproducesOutputs) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT a, ViT::Create(SmallViT("krause"), 5));
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT b, ViT::Create(SmallViT("krause"), 6));
  KRAUSE_ASSERT_OK_AND_ASSIGN(
      std::string bytes,
      SerializeSafetensors(a.parameters().items(), {{"config", a.config().ToJson()}}));
  KRAUSE_ASSERT_OK_AND_ASSIGN(SafetensorsContents c, ParseSafetensors(bytes));
  ASSERT_TRUE(b.parameters().LoadStrict(c.tensors, ViT::IgnoredCheckpointNames()).ok());
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({2, 1, 12, 12});
  EXPECT_TRUE(at::equal(a.Forward(x), b.Forward(x)));
}

TEST(PixelModel, ConditionalConfigsRoundTripAndUnconditionalJsonIsUnchanged) {
  PixelModelConfig c = SmallPixelModel("krause", true);
  const std::string plain = c.ToJson();
  EXPECT_EQ(plain.find("classes"), std::string::npos);  // the official keys only
  c.classes = 3;
  c.labels = {"a", "b", "c"};
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModelConfig back, PixelModelConfig::FromJson(c.ToJson()));
  EXPECT_EQ(back.classes, 3);
  EXPECT_EQ(back.labels, c.labels);
  EXPECT_EQ(back.ToJson(), c.ToJson());
  c.labels = {"a"};
  EXPECT_THAT(PixelModelConfig::FromJson(c.ToJson()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 1 labels")));
  // The class embedding comes last: every other parameter is what the unconditional model of
  // the same size and seed draws.
  c.labels = {};
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel cond, PixelModel::Create(c, 4));
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel uncond,
                              PixelModel::Create(SmallPixelModel("krause", true), 4));
  EXPECT_EQ(cond.parameters().Get("class_emb.weight").sizes(), (std::vector<int64_t>{4, 32}));
  for (const auto& [name, t] : uncond.parameters().items()) {
    EXPECT_TRUE(at::equal(t, cond.parameters().Get(name))) << name;
  }
  // The class is added at every position: the null class differs from class 0 everywhere.
  at::NoGradGuard no_grad;
  const at::Tensor px = at::randint(0, 256, {2, 29}, at::kLong);
  const at::Tensor none = cond.Forward(px);
  const at::Tensor zero = cond.Forward(px, KrauseImpl::kAuto, at::zeros({2}, at::kLong));
  EXPECT_TRUE(at::equal(none, cond.Forward(px, KrauseImpl::kAuto, at::full({2}, 3, at::kLong))));
  EXPECT_GT((none - zero).abs().amax({0, 2}).min().item<double>(), 0.0);
  EXPECT_LE(RelativeMaxError(cond.Forward(px, KrauseImpl::kWindowed, at::zeros({2}, at::kLong)),
                             cond.Forward(px, KrauseImpl::kReference, at::zeros({2}, at::kLong))),
            1e-5);
  EXPECT_THROW(uncond.Forward(px, KrauseImpl::kAuto, at::zeros({2}, at::kLong)), std::exception);
}

// class_norm: a per-class scale and shift of every LayerNorm's output, zero at initialisation.
// The config round-trips (and is refused without classes); a fresh model computes what the same
// model without class_norm computes (bit for bit: h * 1 + 0); with trained (here: random) scales
// the logits depend on the class at every position through every norm, the forward, the
// reference attention and the prefill + decode step agree, and a checkpoint reloads.
TEST(PixelModel, ClassNormScalesEveryNormPerClass) {
  PixelModelConfig c = SmallPixelModel("krause", true);
  c.classes = 3;
  c.class_norm = true;
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModelConfig back, PixelModelConfig::FromJson(c.ToJson()));
  EXPECT_TRUE(back.class_norm);
  EXPECT_EQ(back.ToJson(), c.ToJson());
  PixelModelConfig bad = c;
  bad.classes = 0;
  EXPECT_THAT(bad.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("class_norm")));
  PixelModelConfig plain_cfg = c;
  plain_cfg.class_norm = false;
  EXPECT_EQ(plain_cfg.ToJson().find("class_norm"), std::string::npos);

  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(c, 4));
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel plain, PixelModel::Create(plain_cfg, 4));
  for (const char* name : {"layers.0.ln1.class_scale", "layers.1.ln2.class_shift",
                           "ln_f.class_scale", "ln_f.class_shift"}) {
    ASSERT_TRUE(m.parameters().Has(name)) << name;
    EXPECT_EQ(m.parameters().Get(name).sizes(), (std::vector<int64_t>{4, 32})) << name;
  }
  at::NoGradGuard no_grad;
  const at::Tensor px = at::randint(0, 256, {2, 29}, at::kLong);
  const at::Tensor cls = at::tensor(std::vector<int64_t>{0, 2});
  EXPECT_TRUE(
      at::equal(m.Forward(px, KrauseImpl::kAuto, cls), plain.Forward(px, KrauseImpl::kAuto, cls)));
  at::Generator gen = at::detail::createCPUGenerator(3);
  for (auto& [name, t] : m.parameters().items()) {
    if (name.find(".class_") != std::string::npos)
      t.copy_(testing::GaussianTensor(t.sizes(), 0.3, gen));
  }
  const at::Tensor with_norm = m.Forward(px, KrauseImpl::kAuto, cls);
  // Only the norms differ from the plain model: every position changes.
  EXPECT_GT((with_norm - plain.Forward(px, KrauseImpl::kAuto, cls))
                .abs()
                .amax({0, 2})
                .min()
                .item<double>(),
            0.0);
  EXPECT_LE(RelativeMaxError(m.Forward(px, KrauseImpl::kReference, cls), with_norm), 1e-5);
  // Prefill of the first 10 tokens, then decode steps, equal the forward (class 2).
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelKvCache cache, PixelKvCache::Create(c, 2));
  cache.SetClass(1, 2);
  const at::Tensor u = at::cat({at::full({1}, PixelModel::kStartToken, at::kLong), px[1]});
  const at::Tensor full = with_norm[1];
  EXPECT_LE(RelativeMaxError(m.Prefill(u.narrow(0, 0, 10), 1, &cache), full.narrow(0, 0, 10)),
            1e-5);
  for (int64_t p = 10; p < 30; ++p) {
    const at::Tensor step = m.DecodeStep(u.narrow(0, p, 1), at::full({1}, p, at::kLong),
                                         at::full({1}, 1, at::kLong), &cache);
    EXPECT_LE(RelativeMaxError(step[0], full[p]), 1e-5) << p;
  }
  // A checkpoint reloads into a model made from its config.
  KRAUSE_ASSERT_OK_AND_ASSIGN(
      std::string bytes,
      SerializeSafetensors(m.parameters().items(), {{"config", m.config().ToJson()}}));
  KRAUSE_ASSERT_OK_AND_ASSIGN(SafetensorsContents contents, ParseSafetensors(bytes));
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel loaded, PixelModel::Create(back, 9));
  ASSERT_TRUE(loaded.parameters().LoadStrict(contents.tensors).ok());
  EXPECT_TRUE(at::equal(loaded.Forward(px, KrauseImpl::kAuto, cls), with_norm));
}

TEST(PixelModel, OfficialParameterNames) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel k,
                              PixelModel::Create(SmallPixelModel("krause", false), 1));
  for (const char* name :
       {"token_emb.weight", "pos_emb.weight", "layers.0.ln1.weight", "layers.1.attn.W_v.bias",
        "layers.0.attn.log_sigma", "layers.1.mlp.2.weight", "ln_f.bias", "head.weight"}) {
    EXPECT_TRUE(k.parameters().Has(name)) << name;
  }
  EXPECT_EQ(k.parameters().Get("layers.0.attn.log_sigma").sizes(), (std::vector<int64_t>{4, 1, 1}));
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel s,
                              PixelModel::Create(SmallPixelModel("softmax", false), 1));
  EXPECT_TRUE(s.parameters().Has("layers.0.attn.q_proj.weight"));
  EXPECT_FALSE(s.parameters().Has("start_token"));
}

TEST(PixelModel, TrainingAndInferenceForwardAgree) {
  for (bool start : {false, true}) {
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m,
                                PixelModel::Create(SmallPixelModel("krause", start), 2));
    const at::Tensor px = at::randint(0, 256, {3, 29}, at::kLong);
    at::NoGradGuard no_grad;
    const at::Tensor ref = m.Forward(px, KrauseImpl::kReference);
    EXPECT_EQ(ref.sizes(), (std::vector<int64_t>{3, start ? 30 : 29, 256}));
    EXPECT_LE(RelativeMaxError(m.Forward(px, KrauseImpl::kWindowed), ref), 1e-5);
    EXPECT_LE(RelativeMaxError(m.Forward(px, KrauseImpl::kFusedCpu), ref), 1e-5);
  }
}

TEST(PixelModel, BothAttentionsAreCausal) {
  for (const char* attention : {"krause", "softmax"}) {
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m,
                                PixelModel::Create(SmallPixelModel(attention, true), 4));
    at::Tensor px = at::randint(0, 256, {1, 29}, at::kLong);
    at::NoGradGuard no_grad;
    const at::Tensor before = m.Forward(px);
    px[0][20] = (px[0][20].item<int64_t>() + 1) % 256;  // changes input position 21 onwards
    const at::Tensor after = m.Forward(px);
    EXPECT_TRUE(at::equal(before.narrow(1, 0, 21), after.narrow(1, 0, 21))) << attention;
    EXPECT_FALSE(at::equal(before.narrow(1, 21, 9), after.narrow(1, 21, 9))) << attention;
  }
}

TEST(PixelModel, NllMatchesCrossEntropyByHand) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(SmallPixelModel("krause", true), 7));
  const at::Tensor img = at::randint(0, 256, {2, 30}, at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor nll = m.NllPerImage(img);
  const at::Tensor logits = m.Forward(img.narrow(1, 0, 29));  // 30 positions
  double by_hand = 0;
  for (int64_t t = 0; t < 30; ++t) {
    const at::Tensor lp = at::log_softmax(logits[0][t], -1);
    by_hand -= lp[img[0][t].item<int64_t>()].item<double>();
  }
  EXPECT_NEAR(nll[0].item<double>(), by_hand / 30, 1e-5);
  // Without a start token the first subpixel is not scored: N - 1 targets.
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel off,
                              PixelModel::Create(SmallPixelModel("krause", false), 7));
  EXPECT_EQ(off.Forward(img.narrow(1, 0, 29)).size(1), 29);
  EXPECT_TRUE(at::isfinite(off.NllPerImage(img)).all().item<bool>());
}

TEST(Flops, KarmSavesAttentionFlopsAtLongSequences) {
  PixelModelConfig k = SmallPixelModel("krause", true);
  k.height = k.width_px = 28;
  k.window = 64;
  k.top_k = 32;
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel karm, PixelModel::Create(k, 1));
  const AttentionCost c = karm.FlopsPerImage();
  EXPECT_LT(c.executed_flops, c.dense_equivalent_flops);
  k.attention = AttentionKind::kSoftmax;
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel arm, PixelModel::Create(k, 1));
  EXPECT_DOUBLE_EQ(arm.FlopsPerImage().executed_flops, c.dense_equivalent_flops);
}

}  // namespace
}  // namespace krause
