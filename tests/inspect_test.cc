// Inspection of a model's attention (model/engine/inspect.h): the kept keys and weights of every
// recorded layer equal the reference operator's on the very q, k, v the serving forward saw
// (classifier, generator with and without a class, several layers, every serving
// implementation); softmax listings are the top k of the reference probabilities with the rest
// as `outside`; the summary figures follow their definitions; bad options name their field.
#include "model/engine/inspect.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

ViTConfig SmallViT(AttentionKind attention) {
  ViTConfig c;
  c.attention = attention;
  c.image_size = 8;
  c.patch = 2;  // a 4x4 grid + CLS: neighbourhoods and top-k that really select
  c.d_model = 16;
  c.depth = 3;
  c.heads = 2;
  c.mlp = 32;
  c.classes = 5;
  return c;
}

PixelModelConfig SmallGenerator(AttentionKind attention, int64_t classes, bool start_token) {
  PixelModelConfig c;
  c.attention = attention;
  c.height = 5;
  c.width_px = 4;
  c.channels = 2;  // 40 positions; subpixels of one pixel are 0 apart
  c.d_model = 16;
  c.depth = 3;
  c.heads = 2;
  c.window = 7;
  c.top_k = 4;
  c.classes = classes;
  c.start_token = start_token;
  return c;
}

at::Tensor RandomImage(at::IntArrayRef shape, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(0, 256, shape, gen, at::kLong).to(at::kByte);
}

// Every listed query of every head of `layer` against the reference operator on its inputs.
void ExpectReferenceSelection(const LayerAttention& layer, const Neighbourhood& nb, int64_t top_k,
                              const at::Tensor& log_sigma) {
  ASSERT_TRUE(layer.q.defined());
  const c10::InferenceMode inference;
  KrauseOptions o;
  o.neighbourhood = nb;
  o.top_k = top_k;
  o.impl = KrauseImpl::kReference;
  o.return_selection = true;
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult ref,
                              KrauseAttention(layer.q, layer.k_in, layer.v, log_sigma, o));
  const at::Tensor sigma = log_sigma.reshape({-1}).exp().expand({layer.q.size(1)});
  for (const HeadAttention& head : layer.heads) {
    EXPECT_NEAR(head.sigma, sigma[head.head].item<double>(), 1e-9);
    for (const QueryAttention& qa : head.queries) {
      const at::Tensor idx = ref.indices[0][head.head][qa.query];
      const at::Tensor w = ref.weights[0][head.head][qa.query];
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < idx.size(0); ++j)
        if (idx[j].item<int64_t>() >= 0) keys.push_back(idx[j].item<int64_t>());
      ASSERT_EQ(qa.keys, keys) << "layer " << layer.layer << " head " << head.head << " query "
                               << qa.query;
      for (size_t j = 0; j < keys.size(); ++j) EXPECT_NEAR(qa.weights[j], w[j].item<float>(), 1e-6);
      EXPECT_EQ(qa.outside, 0.0f);
    }
  }
}

TEST(Inspect, KrauseClassifierKeepsWhatTheReferenceKeeps) {
  const ViTConfig c = SmallViT(AttentionKind::kKrause);
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT vit, ViT::Create(c, 7));
  const at::Tensor image = RandomImage({1, 8, 8}, 1);
  for (KrauseImpl impl : {KrauseImpl::kFusedCpu, KrauseImpl::kWindowed, KrauseImpl::kReference}) {
    InspectOptions o;
    o.impl = impl;
    o.keep_inputs = true;
    o.layers = {2, 0};  // any order; answered ascending
    KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection in, InspectClassifier(vit, image, o));
    ASSERT_EQ(in.layers.size(), 2u);
    EXPECT_EQ(in.layers[0].layer, 0);
    EXPECT_EQ(in.layers[1].layer, 2);
    EXPECT_TRUE(in.krause);
    EXPECT_EQ(in.tokens, 17);
    EXPECT_EQ(in.queries.size(), 17u);
    const Neighbourhood nb = Neighbourhood::Grid(4, 4, c.radius, c.metric, c.cls);
    for (const LayerAttention& layer : in.layers) {
      EXPECT_EQ(layer.k, c.TopKSchedule()[layer.layer]);
      ExpectReferenceSelection(
          layer, nb, c.TopKSchedule()[layer.layer],
          vit.parameters().Get("blocks." + std::to_string(layer.layer) + ".attention.log_sigma"));
    }
  }
}

TEST(Inspect, KrauseGeneratorKeepsWhatTheReferenceKeepsWithAndWithoutAClass) {
  for (bool start : {true, false}) {
    const PixelModelConfig c = SmallGenerator(AttentionKind::kKrause, 3, start);
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel karm, PixelModel::Create(c, 5));
    const at::Tensor image = RandomImage({c.seq_len()}, 2);
    for (int64_t cls : {-1, 2}) {
      InspectOptions o;
      o.keep_inputs = true;
      o.layers = {1, 2};
      o.queries = {39, 0, 8, 17};  // request order is kept
      KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection in, InspectGenerator(karm, image, cls, o));
      ASSERT_EQ(in.layers.size(), 2u);
      EXPECT_EQ(in.queries, o.queries);
      for (const LayerAttention& layer : in.layers) {
        ASSERT_EQ(layer.heads.size(), 2u);
        ASSERT_EQ(layer.heads[0].queries.size(), 4u);
        EXPECT_EQ(layer.heads[0].queries[0].query, 39);
        // Position 0 attends to itself alone; position 39 keeps top_k of its window.
        EXPECT_EQ(layer.heads[0].queries[1].keys, std::vector<int64_t>{0});
        EXPECT_EQ(layer.heads[0].queries[0].keys.size(), 4u);
        ExpectReferenceSelection(
            layer, Neighbourhood::Causal(c.window), c.top_k,
            karm.parameters().Get("layers." + std::to_string(layer.layer) + ".attn.log_sigma"));
      }
    }
  }
}

TEST(Inspect, TheClassChangesWhatAConditionalGeneratorKeeps) {
  const PixelModelConfig c = SmallGenerator(AttentionKind::kKrause, 3, true);
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel karm, PixelModel::Create(c, 5));
  const at::Tensor image = RandomImage({c.seq_len()}, 2);
  InspectOptions o;
  o.layers = {2};
  KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection none, InspectGenerator(karm, image, -1, o));
  KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection two, InspectGenerator(karm, image, 2, o));
  bool differs = false;
  for (size_t q = 0; q < none.queries.size(); ++q)
    differs |=
        none.layers[0].heads[0].queries[q].weights != two.layers[0].heads[0].queries[q].weights;
  EXPECT_TRUE(differs);
}

// Softmax: the listing is the top k of the reference probabilities (weight descending, the larger
// key first on a tie), the rest of the row is `outside`.
void ExpectSoftmaxListing(const Inspection& in, bool causal) {
  for (const LayerAttention& layer : in.layers) {
    ASSERT_TRUE(layer.q.defined());
    const c10::InferenceMode inference;
    const int64_t n = layer.q.size(2);
    at::Tensor scores = at::matmul(layer.q, layer.k_in.transpose(-1, -2)) /
                        std::sqrt(static_cast<double>(layer.q.size(3)));
    if (causal) scores = scores.masked_fill(at::ones({n, n}, at::kBool).triu(1), -INFINITY);
    const at::Tensor probs = at::softmax(scores, -1);
    for (const HeadAttention& head : layer.heads) {
      EXPECT_EQ(head.sigma, 0);
      for (const QueryAttention& qa : head.queries) {
        const at::Tensor row = probs[0][head.head][qa.query];
        std::vector<std::pair<float, int64_t>> ranked;
        for (int64_t j = 0; j < n; ++j)
          if (row[j].item<float>() > 0) ranked.emplace_back(row[j].item<float>(), j);
        std::sort(ranked.begin(), ranked.end(), [](auto a, auto b) {
          return a.first != b.first ? a.first > b.first : a.second > b.second;
        });
        const size_t k = std::min<size_t>(layer.k, ranked.size());
        ASSERT_EQ(qa.keys.size(), k);
        double listed = 0;
        for (size_t j = 0; j < k; ++j) {
          EXPECT_EQ(qa.keys[j], ranked[j].second) << "query " << qa.query << " rank " << j;
          EXPECT_NEAR(qa.weights[j], ranked[j].first, 1e-6);
          listed += qa.weights[j];
        }
        EXPECT_NEAR(listed + qa.outside, 1.0, 1e-5);
        if (causal) {
          for (int64_t key : qa.keys) EXPECT_LE(key, qa.query);
        }
      }
    }
  }
}

TEST(Inspect, SoftmaxModelsListTheirLargestWeightsAndWhatIsOutside) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT vit, ViT::Create(SmallViT(AttentionKind::kSoftmax), 7));
  InspectOptions o;
  o.keep_inputs = true;
  KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection in, InspectClassifier(vit, RandomImage({1, 8, 8}, 3), o));
  EXPECT_FALSE(in.krause);
  EXPECT_EQ(in.layers.size(), 3u);
  EXPECT_EQ(in.layers[2].k, SmallViT(AttentionKind::kSoftmax).TopKSchedule()[2]);
  ExpectSoftmaxListing(in, false);
  o.top_k = 17;  // every key: nothing outside
  o.layers = {1};
  KRAUSE_ASSERT_OK_AND_ASSIGN(in, InspectClassifier(vit, RandomImage({1, 8, 8}, 3), o));
  EXPECT_EQ(in.layers[0].k, 17);
  ExpectSoftmaxListing(in, false);

  const PixelModelConfig c = SmallGenerator(AttentionKind::kSoftmax, 3, true);
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel arm, PixelModel::Create(c, 5));
  o = InspectOptions();
  o.keep_inputs = true;
  o.top_k = 6;
  o.queries = {0, 3, 39};
  KRAUSE_ASSERT_OK_AND_ASSIGN(in, InspectGenerator(arm, RandomImage({c.seq_len()}, 4), 1, o));
  EXPECT_EQ(in.layers[0].heads[0].queries[0].keys, std::vector<int64_t>{0});
  EXPECT_EQ(in.layers[0].heads[0].queries[1].keys.size(), 4u);  // positions 0..3
  EXPECT_EQ(in.layers[0].heads[0].queries[2].keys.size(), 6u);
  ExpectSoftmaxListing(in, true);
}

// The summary figures recomputed from a full listing (every query, every kept key) by their
// definitions in inspect.h.
TEST(Inspect, SummaryFiguresFollowTheirDefinitions) {
  const PixelModelConfig c = SmallGenerator(AttentionKind::kKrause, 0, true);
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel karm, PixelModel::Create(c, 9));
  KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection in,
                              InspectGenerator(karm, RandomImage({c.seq_len()}, 5), -1, {}));
  ASSERT_EQ(in.positions.size(), 40u);
  EXPECT_EQ(in.positions[0], std::make_pair(int64_t{-1}, int64_t{-1}));  // the start token
  EXPECT_EQ(in.positions[1], std::make_pair(int64_t{0}, int64_t{0}));    // subpixel 0
  EXPECT_EQ(in.positions[2], std::make_pair(int64_t{0}, int64_t{0}));    // subpixel 1, pixel 0
  EXPECT_EQ(in.positions[11], std::make_pair(int64_t{1}, int64_t{1}));   // subpixel 10, pixel 5
  for (const LayerAttention& layer : in.layers) {
    for (const HeadAttention& head : layer.heads) {
      double sink = 0, effective = 0, distance = 0;
      int64_t placed_rows = 0;
      std::vector<double> received(in.tokens, 0.0);
      for (const QueryAttention& qa : head.queries) {
        double largest = 0, entropy = 0, weighted = 0, placed = 0, sum = 0;
        for (size_t j = 0; j < qa.keys.size(); ++j) {
          const double w = qa.weights[j];
          largest = std::max(largest, w);
          if (w > 0) entropy -= w * std::log(w);
          received[qa.keys[j]] += w;
          sum += w;
          const auto a = in.positions[qa.query], b = in.positions[qa.keys[j]];
          if (a.first >= 0 && b.first >= 0) {
            weighted += w * std::hypot(a.first - b.first, a.second - b.second);
            placed += w;
          }
        }
        EXPECT_NEAR(sum, 1.0, 1e-5);
        sink += largest;
        effective += std::exp(entropy);
        if (placed > 0) distance += weighted / placed, ++placed_rows;
      }
      const double n = static_cast<double>(head.queries.size());
      EXPECT_NEAR(head.sink_share, sink / n, 1e-6);
      EXPECT_NEAR(head.effective_neighbours, effective / n, 1e-5);
      EXPECT_NEAR(head.mean_distance, distance / placed_rows, 1e-6);
      const auto busiest = std::max_element(received.begin(), received.end());
      EXPECT_EQ(head.busiest_key, busiest - received.begin());
      EXPECT_NEAR(head.busiest_key_share, *busiest / n, 1e-6);
      EXPECT_GE(head.effective_neighbours, 1.0);
      EXPECT_LE(head.effective_neighbours, c.top_k + 1e-9);
    }
  }
}

// A head so sharp that the kept keys' weights underflow to 0 but one: the figures stay finite (a
// zero weight adds nothing to the entropy), one neighbour, every query its own sink.
TEST(Inspect, ZeroWeightsKeepTheFiguresFinite) {
  const PixelModelConfig c = SmallGenerator(AttentionKind::kKrause, 0, false);
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel karm, PixelModel::Create(c, 9));
  {
    at::NoGradGuard no_grad;
    karm.parameters().Get("layers.0.attn.log_sigma").fill_(-8.0);
  }
  InspectOptions o;
  o.layers = {0};
  KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection in,
                              InspectGenerator(karm, RandomImage({c.seq_len()}, 5), -1, o));
  bool zero_listed = false;
  for (const HeadAttention& head : in.layers[0].heads) {
    EXPECT_TRUE(std::isfinite(head.effective_neighbours));
    EXPECT_NEAR(head.effective_neighbours, 1.0, 1e-3);
    EXPECT_NEAR(head.sink_share, 1.0, 1e-3);
    for (const QueryAttention& qa : head.queries)
      for (float w : qa.weights) zero_listed |= w == 0.0f;
  }
  EXPECT_TRUE(zero_listed);
}

TEST(Inspect, BadOptionsNameTheirField) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT vit, ViT::Create(SmallViT(AttentionKind::kKrause), 7));
  KRAUSE_ASSERT_OK_AND_ASSIGN(ViT softmax, ViT::Create(SmallViT(AttentionKind::kSoftmax), 7));
  auto check = [](const InspectShape& shape, InspectOptions o, const std::string& field,
                  const std::string& text) {
    std::string got;
    EXPECT_THAT(CheckInspectOptions(shape, o, &got),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(text)));
    EXPECT_EQ(got, field);
  };
  const InspectShape shape = InspectShapeOf(vit);
  InspectOptions o;
  o.layers = {0, 3};
  check(shape, o, "layers[1]", "layers[1] = 3 is out of range: the model's layers are 0 .. 2");
  o.layers = {1, 1};
  check(shape, o, "layers[1]", "listed twice");
  o = InspectOptions();
  o.queries = {16, 17};
  check(shape, o, "queries[1]", "queries[1] = 17 is out of range: the model's tokens are 0 .. 16");
  o.queries = {-1};
  check(shape, o, "queries[0]", "out of range");
  o = InspectOptions();
  o.top_k = 3;
  check(shape, o, "top_k", "top_k is for softmax models");
  o.top_k = 18;
  check(InspectShapeOf(softmax), o, "top_k", "top_k = 18 is out of range");
  // 17 queries x 2 heads x (2 + 3 + 4 keys) = 306 listed keys.
  o = InspectOptions();
  o.max_entries = 305;
  check(shape, o, "queries", "the reply would list 306 keys");
  o.max_entries = 306;
  std::string field;
  EXPECT_TRUE(CheckInspectOptions(shape, o, &field).ok());
  // And through the entry points, before any forward.
  o.layers = {9};
  EXPECT_THAT(InspectClassifier(vit, RandomImage({1, 8, 8}, 1), o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layers[0] = 9")));
  EXPECT_THAT(InspectClassifier(vit, RandomImage({1, 9, 8}, 1), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("uint8 [C, H, W]")));
  KRAUSE_ASSERT_OK_AND_ASSIGN(
      PixelModel karm, PixelModel::Create(SmallGenerator(AttentionKind::kKrause, 0, true), 5));
  EXPECT_THAT(InspectGenerator(karm, RandomImage({40}, 1), 1, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unconditional")));
}

}  // namespace
}  // namespace krause
