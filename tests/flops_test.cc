// Analytic FLOP counts against hand-computed cases (conventions in model/attention/flops.h).
#include "model/attention/flops.h"

#include <gtest/gtest.h>

namespace krause {
namespace {

TEST(Flops, CausalHandComputed) {
  // N = 4, W = 2, k = 1, H = 1, d = 2: c = [1, 2, 2, 2], k_i = [1, 1, 1, 1].
  // scores: 7 * (2*2 + 1) = 35; softmax 5 * 4 = 20; aggregation 2*2 * 4 = 16; biases 4 * 5 = 20.
  const AttentionCost c = KrauseAttentionCost(Neighbourhood::Causal(2), 4, 1, 1, 2);
  EXPECT_EQ(c.candidates, 7);
  EXPECT_EQ(c.kept, 4);
  EXPECT_DOUBLE_EQ(c.executed_flops, 35 + 20 + 16 + 20);
  // dense: prefixes 1..4 = 10 visible: scores 10 * 5 = 50; softmax 50; aggregation 40.
  EXPECT_DOUBLE_EQ(c.dense_equivalent_flops, 50 + 50 + 40);
  EXPECT_DOUBLE_EQ(c.selection_comparisons, 6);  // rows 1..3 select 1 of 2
  EXPECT_NEAR(c.saving(), 1.0 - 91.0 / 140.0, 1e-12);
}

TEST(Flops, HeadsScaleLinearly) {
  const AttentionCost one = KrauseAttentionCost(Neighbourhood::Causal(8), 20, 3, 1, 16);
  const AttentionCost eight = KrauseAttentionCost(Neighbourhood::Causal(8), 20, 3, 8, 16);
  EXPECT_DOUBLE_EQ(eight.executed_flops, 8 * one.executed_flops);
  EXPECT_DOUBLE_EQ(eight.dense_equivalent_flops, 8 * one.dense_equivalent_flops);
}

TEST(Flops, GridWithClsHandComputed) {
  // 2x2 grid, manhattan r = 1, CLS: CLS row sees 5; each patch sees CLS + self + 2 = 4.
  // k = 10 keeps all: no selection. H = 1, d = 1: per query c*3 + 5c + 2c = 10c.
  const AttentionCost c =
      KrauseAttentionCost(Neighbourhood::Grid(2, 2, 1, GridMetric::kManhattan, true), 5, 10, 1, 1);
  EXPECT_EQ(c.candidates, 5 + 4 * 4);
  EXPECT_DOUBLE_EQ(c.executed_flops, 10.0 * 21 + 5 * 3);
  EXPECT_DOUBLE_EQ(c.dense_equivalent_flops, 10.0 * 25);
  EXPECT_DOUBLE_EQ(c.selection_comparisons, 0);
}

TEST(Flops, DecodeStepIsFlatInPositionAndDenseGrows) {
  const AttentionCost early = KrauseDecodeStepCost(300, 256, 192, 8, 64);
  const AttentionCost late = KrauseDecodeStepCost(3000, 256, 192, 8, 64);
  EXPECT_DOUBLE_EQ(early.executed_flops, late.executed_flops);
  // 8 heads * (256*129 + 5*192 + 128*192 + 129)
  EXPECT_DOUBLE_EQ(late.executed_flops, 8.0 * (256 * 129 + 5 * 192 + 128 * 192 + 129));
  EXPECT_DOUBLE_EQ(late.dense_equivalent_flops, 8.0 * (3001 * 129 + 5 * 3001 + 128 * 3001));
  EXPECT_DOUBLE_EQ(late.selection_comparisons, 8.0 * 256);
  const AttentionCost first = KrauseDecodeStepCost(0, 256, 192, 1, 4);
  EXPECT_EQ(first.candidates, 1);
  EXPECT_DOUBLE_EQ(first.selection_comparisons, 0);
}

}  // namespace
}  // namespace krause
