// Candidate enumeration of every neighbourhood kind, checked against hand-written lists.
#include "model/attention/neighbourhood.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace krause {
namespace {

using ::testing::ElementsAre;

std::vector<int64_t> Cands(const Neighbourhood& nb, int64_t n, int64_t i) {
  std::vector<int64_t> out;
  AppendCandidates(nb, n, i, &out);
  EXPECT_EQ(static_cast<int64_t>(out.size()), NumCandidates(nb, n, i));
  return out;
}

TEST(Neighbourhood, CausalWindowIncludesSelfAndClipsAtTheStart) {
  const Neighbourhood nb = Neighbourhood::Causal(3);
  EXPECT_THAT(Cands(nb, 10, 0), ElementsAre(0));
  EXPECT_THAT(Cands(nb, 10, 1), ElementsAre(0, 1));
  EXPECT_THAT(Cands(nb, 10, 5), ElementsAre(3, 4, 5));
  EXPECT_EQ(MaxCandidates(nb, 10), 3);
  EXPECT_EQ(MaxCandidates(nb, 2), 2);
}

TEST(Neighbourhood, GridManhattanRadiusOneWithCls) {
  // 3x3 grid + CLS: patch p at index p + 1.
  const Neighbourhood nb = Neighbourhood::Grid(3, 3, 1, GridMetric::kManhattan, true);
  EXPECT_THAT(Cands(nb, 10, 0), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));  // CLS sees all
  EXPECT_THAT(Cands(nb, 10, 1), ElementsAre(0, 1, 2, 4));                    // corner (0,0)
  EXPECT_THAT(Cands(nb, 10, 5), ElementsAre(0, 2, 4, 5, 6, 8));              // centre (1,1)
  EXPECT_THAT(Cands(nb, 10, 6), ElementsAre(0, 3, 5, 6, 9));                 // edge (1,2)
  EXPECT_EQ(MaxCandidates(nb, 10), 10);
}

TEST(Neighbourhood, GridChebyshevRadiusTwoClipsAtEveryBorder) {
  const Neighbourhood nb = Neighbourhood::Grid(5, 5, 2, GridMetric::kChebyshev, false);
  EXPECT_EQ(NumCandidates(nb, 25, 12), 25);  // centre: the whole 5x5
  EXPECT_EQ(NumCandidates(nb, 25, 0), 9);    // corner: 3x3
  EXPECT_EQ(NumCandidates(nb, 25, 2), 15);   // top edge middle: 3 rows x 5 cols
  EXPECT_THAT(Cands(nb, 25, 24), ElementsAre(12, 13, 14, 17, 18, 19, 22, 23, 24));
}

TEST(Neighbourhood, GridManhattanRadiusTwoIsADiamond) {
  const Neighbourhood nb = Neighbourhood::Grid(5, 5, 2, GridMetric::kManhattan, false);
  EXPECT_THAT(Cands(nb, 25, 12), ElementsAre(2, 6, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 22));
}

TEST(Neighbourhood, ThinGridsAndGlobal) {
  const Neighbourhood row = Neighbourhood::Grid(1, 4, 1, GridMetric::kChebyshev, false);
  EXPECT_THAT(Cands(row, 4, 0), ElementsAre(0, 1));
  EXPECT_THAT(Cands(row, 4, 2), ElementsAre(1, 2, 3));
  EXPECT_THAT(Cands(Neighbourhood::Global(), 3, 1), ElementsAre(0, 1, 2));
}

TEST(Neighbourhood, CandidateTableMatchesEnumeration) {
  const Neighbourhood nb = Neighbourhood::Grid(4, 3, 1, GridMetric::kManhattan, true);
  const CandidateTable t = BuildCandidateTable(nb, 13);
  EXPECT_EQ(t.width, 13);
  for (int64_t i = 0; i < 13; ++i) {
    const auto c = Cands(nb, 13, i);
    ASSERT_EQ(t.count[i], static_cast<int64_t>(c.size()));
    for (size_t x = 0; x < c.size(); ++x) EXPECT_EQ(t.index[i * t.width + x], c[x]);
    for (int64_t x = c.size(); x < t.width; ++x) EXPECT_EQ(t.index[i * t.width + x], -1);
  }
}

TEST(Neighbourhood, ToStringIsReadable) {
  EXPECT_EQ(Neighbourhood::Causal(128).ToString(), "causal(W=128)");
  EXPECT_EQ(Neighbourhood::Grid(8, 8, 1, GridMetric::kManhattan, true).ToString(),
            "grid(8x8,r=1,manhattan,cls)");
  EXPECT_EQ(Neighbourhood::Global().ToString(), "global");
}

}  // namespace
}  // namespace krause
