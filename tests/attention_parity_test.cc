// Parity as data: every implementation of Krause attention against the reference over a table of
// cases (lengths at and around the window, k = 1 .. more than W, grids with every border, CLS,
// ties, sigma from 2^-10 to 2^10, B and H > 1, head dims 16/32/64).
//
// Tolerance: fp32 outputs within 1e-5 of the reference relative to the output scale (max |ref|).
// Inputs are quantized and scaled by powers of two (test_util.h), with sigma a power of two, so
// scores are exact up to one final scaling that preserves order: kept sets and their rank order
// must then match EXACTLY, and the remaining error is the fp32 rounding of exp and the sums.
// A second family uses Gaussian inputs on smaller cases, checking the same tolerance.
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "model/attention/decode.h"
#include "model/attention/krause_attention.h"
#include "model/attention/pair_sums.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::GaussianTensor;
using ::krause::testing::QuantizedTensor;
using ::krause::testing::RelativeMaxError;

enum class Family { kQuantized, kGaussian, kConstant };

struct Case {
  std::string name;
  Neighbourhood nb;
  int64_t n = 0, top_k = 1, batch = 2, heads = 2, head_dim = 16;
  int sigma_log2 = 0;  // sigma = 2^sigma_log2
  int scale_log2 = 0;  // inputs = sigma * quantized * 2^scale_log2
  bool per_head_sigma = false;
  Family family = Family::kQuantized;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string Sanitize(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  const int sigmas[] = {-10, -3, 0, 3, 10};
  const int dims[] = {16, 32, 64};
  int rot = 0;
  // causal: N in {1, 2, W-1, W, W+1, 3W+5} x W in {1, 4, 128, 256} x k in {1, 2, W, W+3}.
  for (int64_t w : {1, 4, 128, 256}) {
    for (int64_t n : {int64_t{1}, int64_t{2}, w - 1, w, w + 1, 3 * w + 5}) {
      if (n < 1) continue;
      for (int64_t k : {int64_t{1}, int64_t{2}, w, w + 3}) {
        Case c;
        c.nb = Neighbourhood::Causal(w);
        c.n = n;
        c.top_k = k;
        c.head_dim = dims[rot % 3];
        c.sigma_log2 = sigmas[rot % 5];
        c.per_head_sigma = rot % 2 == 0;
        c.batch = 1 + rot % 2;
        c.heads = 1 + (rot / 2) % 3;
        ++rot;
        cases.push_back(c);
      }
    }
  }
  // grid: radius 1 and 2, both metrics, with and without CLS, square and thin grids (borders).
  const std::pair<int64_t, int64_t> shapes[] = {{8, 8}, {3, 5}, {1, 7}, {6, 1}, {14, 14}};
  for (auto [rows, cols] : shapes) {
    for (int64_t radius : {1, 2}) {
      for (GridMetric m : {GridMetric::kManhattan, GridMetric::kChebyshev}) {
        for (bool cls : {false, true}) {
          for (int64_t k : {1, 2, 6, 30}) {
            if (rows == 14 && k != 6) continue;  // keep the big grid to one k
            Case c;
            c.nb = Neighbourhood::Grid(rows, cols, radius, m, cls);
            c.n = rows * cols + (cls ? 1 : 0);
            c.top_k = k;
            c.head_dim = dims[rot % 3];
            c.sigma_log2 = sigmas[rot % 5];
            c.per_head_sigma = rot % 2 == 1;
            c.heads = 1 + rot % 3;
            ++rot;
            cases.push_back(c);
          }
        }
      }
    }
  }
  // global
  for (int64_t n : {1, 5, 33}) {
    for (int64_t k : {1, 4, 40}) {
      Case c;
      c.nb = Neighbourhood::Global();
      c.n = n;
      c.top_k = k;
      c.head_dim = dims[rot % 3];
      ++rot;
      cases.push_back(c);
    }
  }
  // Extreme score scales: huge scores (tiny sigma, unscaled inputs) and tiny scores.
  for (auto [sig, scale] : {std::pair{-10, 10}, std::pair{10, -10}, std::pair{-3, 6}}) {
    Case c;
    c.nb = Neighbourhood::Causal(16);
    c.n = 40;
    c.top_k = 5;
    c.head_dim = 32;
    c.sigma_log2 = sig;
    c.scale_log2 = scale;
    cases.push_back(c);
  }
  // Ties: constant inputs, every score equal.
  for (Neighbourhood nb :
       {Neighbourhood::Causal(8), Neighbourhood::Grid(4, 4, 1, GridMetric::kChebyshev, true),
        Neighbourhood::Global()}) {
    Case c;
    c.nb = nb;
    c.n = nb.kind == Neighbourhood::Kind::kGrid ? 17 : 20;
    c.top_k = 3;
    c.family = Family::kConstant;
    cases.push_back(c);
  }
  // Gaussian inputs (not exact), smaller cases.
  for (auto [w, n, k] : {std::tuple{4, 9, 2}, std::tuple{16, 50, 7}, std::tuple{32, 97, 20}}) {
    Case c;
    c.nb = Neighbourhood::Causal(w);
    c.n = n;
    c.top_k = k;
    c.head_dim = 32;
    c.family = Family::kGaussian;
    cases.push_back(c);
  }
  for (auto& c : cases) {
    const char* fam = c.family == Family::kQuantized  ? "q"
                      : c.family == Family::kGaussian ? "g"
                                                      : "const";
    c.name =
        Sanitize(absl::StrCat(c.nb.ToString(), "_N", c.n, "_k", c.top_k, "_B", c.batch, "H",
                              c.heads, "d", c.head_dim, "_s", c.sigma_log2 < 0 ? "m" : "",
                              std::abs(c.sigma_log2), "_x", c.scale_log2 < 0 ? "m" : "",
                              std::abs(c.scale_log2), c.per_head_sigma ? "_ph" : "", "_", fam));
  }
  return cases;
}

struct Inputs {
  at::Tensor q, k, v, log_sigma;
};

Inputs MakeInputs(const Case& c, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const std::vector<int64_t> shape = {c.batch, c.heads, c.n, c.head_dim};
  Inputs in;
  const int qk_scale = c.sigma_log2 + c.scale_log2;
  switch (c.family) {
    case Family::kQuantized:
      in.q = QuantizedTensor(shape, qk_scale, gen);
      in.k = QuantizedTensor(shape, qk_scale, gen);
      break;
    case Family::kGaussian:
      in.q = GaussianTensor(shape, 0.3, gen);
      in.k = GaussianTensor(shape, 0.3, gen);
      break;
    case Family::kConstant:
      in.q = at::full(shape, 0.25f);
      in.k = at::full(shape, 0.5f);
      break;
  }
  in.v = GaussianTensor(shape, 1.0, gen);
  const float ls = static_cast<float>(c.sigma_log2 * std::log(2.0));
  in.log_sigma = c.per_head_sigma ? at::full({c.heads, 1, 1}, ls) : at::full({}, ls);
  if (c.per_head_sigma && c.family != Family::kGaussian) {
    // Larger power-of-two sigmas on later heads: inputs stay exact, scores stay moderate.
    in.log_sigma = in.log_sigma + at::arange(c.heads, at::kFloat).view({c.heads, 1, 1}) *
                                      static_cast<float>(std::log(2.0));
  }
  return in;
}

struct ImplUnderTest {
  std::string name;
  KrauseImpl impl;
  const char* cpu_variant;                                 // for fused_cpu
  internal::GridRoute route = internal::GridRoute::kAuto;  // windowed, grids only
};

std::vector<ImplUnderTest> Impls() {
  std::vector<ImplUnderTest> impls = {
      {"windowed", KrauseImpl::kWindowed, nullptr},
      {"windowed_grid_table", KrauseImpl::kWindowed, nullptr, internal::GridRoute::kCandidateTable},
      {"windowed_grid_dense_rows", KrauseImpl::kWindowed, nullptr,
       internal::GridRoute::kDenseRows}};
  for (int i = 0; i < cpu::NumCpuKernelVariants(); ++i) {
    impls.push_back({absl::StrCat("fused_cpu_", cpu::CpuKernelVariantName(i)),
                     KrauseImpl::kFusedCpu, cpu::CpuKernelVariantName(i)});
  }
  return impls;
}

class AttentionParityTest : public ::testing::TestWithParam<Case> {
 protected:
  void TearDown() override {
    cpu::SetCpuKernelsForTesting(nullptr);
    internal::SetGridRouteForTesting(internal::GridRoute::kAuto);
  }
};

TEST_P(AttentionParityTest, EveryImplementationMatchesTheReference) {
  const Case& c = GetParam();
  const Inputs in = MakeInputs(c, 1234 + c.n * 7 + c.top_k);
  KrauseOptions opts;
  opts.neighbourhood = c.nb;
  opts.top_k = c.top_k;
  opts.return_selection = true;
  opts.impl = KrauseImpl::kReference;
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult ref,
                              KrauseAttention(in.q, in.k, in.v, in.log_sigma, opts));
  ASSERT_TRUE(at::isfinite(ref.out).all().item<bool>());

  for (const ImplUnderTest& impl : Impls()) {
    if (impl.route != internal::GridRoute::kAuto && c.nb.kind != Neighbourhood::Kind::kGrid)
      continue;
    SCOPED_TRACE(impl.name);
    if (impl.cpu_variant) {
      ASSERT_TRUE(cpu::SetCpuKernelsForTesting(impl.cpu_variant));
    }
    internal::SetGridRouteForTesting(impl.route);
    opts.impl = impl.impl;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult got,
                                KrauseAttention(in.q, in.k, in.v, in.log_sigma, opts));
    cpu::SetCpuKernelsForTesting(nullptr);
    internal::SetGridRouteForTesting(internal::GridRoute::kAuto);
    ASSERT_EQ(got.out.sizes(), ref.out.sizes());
    EXPECT_LE(RelativeMaxError(got.out, ref.out), 1e-5);
    ASSERT_EQ(got.indices.sizes(), ref.indices.sizes());
    if (c.family != Family::kGaussian) {
      EXPECT_TRUE(at::equal(got.indices, ref.indices)) << "kept sets or rank order differ";
    } else {
      // Rounding may reorder near-equal scores inside the kept set; the sets still agree.
      EXPECT_TRUE(at::equal(std::get<0>(got.indices.sort(-1)), std::get<0>(ref.indices.sort(-1))));
    }
    EXPECT_LE((got.weights - ref.weights).abs().max().item<double>(), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionParityTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// The documented tie rule, checked on the reference itself: with every score equal, a causal
// window keeps its last (largest-index) keys, in descending index order.
TEST(AttentionTieRule, EqualScoresKeepTheLargestKeyIndices) {
  const at::Tensor x = at::ones({1, 1, 6, 4});
  KrauseOptions opts;
  opts.neighbourhood = Neighbourhood::Causal(4);
  opts.top_k = 2;
  opts.return_selection = true;
  for (KrauseImpl impl : {KrauseImpl::kReference, KrauseImpl::kWindowed, KrauseImpl::kFusedCpu}) {
    opts.impl = impl;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult r, KrauseAttention(x, x, x, at::zeros({}), opts));
    const at::Tensor expected =
        at::tensor({0, -1, 1, 0, 2, 1, 3, 2, 4, 3, 5, 4}, at::kLong).view({1, 1, 6, 2});
    EXPECT_TRUE(at::equal(r.indices, expected)) << KrauseImplName(impl) << "\n" << r.indices;
  }
}

// Rows longer than the small-row sort (windows of 128, the decode step's) whose scores take a
// few distinct values, or all distinct: with few, the k-th largest score is shared by many
// candidates, so the fused kernels' bitwise search for it meets every exit (exactly k at or
// above a candidate, more than k, all keys equal) and the tie rule decides most of the kept set.
// The fused and windowed prefills and the decode step, position by position, must keep the
// reference's indices in its order. Keys are drawn with replacement, so most rows hold identical
// keys: they must score bit-equal in every implementation (a score computed by a GEMM did not,
// on some BLAS kernels; ctest's *.blas_Prescott run repeats this under another kernel).
TEST(AttentionTieRule, LongRowsWithFewDistinctScores) {
  const int64_t n = 300, d = 8, window = 128;
  // Keys and queries drawn from `distinct` vectors: at most that many scores per query (one
  // vector: all equal); with n Gaussian vectors, scores as distinct as real ones.
  for (const int64_t distinct : {int64_t{1}, int64_t{2}, int64_t{4}, n}) {
    at::manual_seed(distinct);
    const at::Tensor protos =
        distinct == n ? at::randn({n, d}) : at::randint(-3, 4, {distinct, d}).to(at::kFloat) * 0.5;
    const at::Tensor k = protos.index_select(0, at::randint(0, distinct, {n})).view({1, 1, n, d});
    const at::Tensor q = protos.index_select(0, at::randint(0, distinct, {n})).view({1, 1, n, d});
    const at::Tensor v = at::randn({1, 1, n, d});
    for (const int64_t top_k : {int64_t{1}, int64_t{37}, int64_t{96}, int64_t{127}}) {
      SCOPED_TRACE(absl::StrCat("distinct ", distinct, ", top_k ", top_k));
      KrauseOptions opts;
      opts.neighbourhood = Neighbourhood::Causal(window);
      opts.top_k = top_k;
      opts.return_selection = true;
      opts.impl = KrauseImpl::kReference;
      KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult want, KrauseAttention(q, k, v, at::zeros({}), opts));
      for (const KrauseImpl impl : {KrauseImpl::kFusedCpu, KrauseImpl::kWindowed}) {
        SCOPED_TRACE(KrauseImplName(impl));
        opts.impl = impl;
        KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult got,
                                    KrauseAttention(q, k, v, at::zeros({}), opts));
        EXPECT_TRUE(at::equal(got.indices, want.indices));
        EXPECT_LT(RelativeMaxError(got.out, want.out), 1e-5);
      }
      KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache cache, KrauseRingCache::Create(1, 1, d, window));
      const at::Tensor slot = at::zeros({1}, at::kLong);
      int64_t wrong = 0;
      for (int64_t p = 0; p < n; ++p) {
        auto row = [&](const at::Tensor& x) { return x[0].narrow(1, p, 1).transpose(0, 1); };
        DecodeSelection sel;
        KRAUSE_ASSERT_OK_AND_ASSIGN(
            at::Tensor out, KrauseDecodeStep(row(q).contiguous(), row(k).contiguous(),
                                             row(v).contiguous(), at::zeros({1}), top_k, slot,
                                             at::full({1}, p, at::kLong), &cache, &sel));
        wrong += !at::equal(sel.indices[0][0], want.indices[0][0][p]);
      }
      EXPECT_EQ(wrong, 0) << "decode positions whose kept indices differ from the reference's";
    }
  }
}

// OrderedDots is each pair's own sum, in t order, each product and each sum rounded on its own:
// the CPU loop, LibTorch's elementwise ops (the GPU's path) and the sums written out here agree
// bit for bit, in fp32 and fp64, with and without broadcast leading dims; identical key columns
// give identical dot products in every row. Its gradient is the matrix product's.
TEST(PairSums, OrderedDotsSumsEachPairByItselfInOrder) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (const int64_t q_batch : {int64_t{2}, int64_t{1}}) {
      SCOPED_TRACE(absl::StrCat(c10::toString(dtype), ", q batch ", q_batch));
      const int64_t d = 13, r = 17, c = 29;
      const at::Tensor q = at::randn({q_batch, 3, r, d}, gen).to(dtype);
      at::Tensor kt = at::randn({2, 3, d, c}, gen).to(dtype);
      kt.select(-1, 5).copy_(kt.select(-1, 0));
      kt.select(-1, 28).copy_(kt.select(-1, 0));
      at::Tensor want = q.narrow(-1, 0, 1) * kt.narrow(-2, 0, 1);
      for (int64_t t = 1; t < d; ++t) want = want + q.narrow(-1, t, 1) * kt.narrow(-2, t, 1);
      const at::Tensor got = internal::OrderedDots(q, kt);
      EXPECT_TRUE(at::equal(got, want));
      EXPECT_TRUE(at::equal(internal::OrderedDotsElementwise(q, kt), want));
      // A transposed (strided) key operand: the same values.
      const at::Tensor strided = kt.transpose(-1, -2).contiguous().transpose(-1, -2);
      EXPECT_TRUE(at::equal(internal::OrderedDots(q, strided), want));
      EXPECT_TRUE(at::equal(got.select(-1, 5), got.select(-1, 0)));
      EXPECT_TRUE(at::equal(got.select(-1, 28), got.select(-1, 0)));
      EXPECT_TRUE(at::allclose(got, at::matmul(q.to(at::kDouble), kt.to(at::kDouble)).to(dtype),
                               1e-5, 1e-5));

      const at::Tensor qg = q.clone().requires_grad_(), kg = kt.clone().requires_grad_();
      const at::Tensor g = at::randn({2, 3, r, c}, gen).to(dtype);
      (internal::OrderedDots(qg, kg) * g).sum().backward();
      const at::Tensor qm = q.clone().requires_grad_(), km = kt.clone().requires_grad_();
      (at::matmul(qm, km) * g).sum().backward();
      EXPECT_TRUE(at::allclose(qg.grad(), qm.grad(), 1e-5, 1e-5));
      EXPECT_TRUE(at::allclose(kg.grad(), km.grad(), 1e-5, 1e-5));
    }
  }
}

// ctest runs this binary twice (tests/CMakeLists.txt): under the machine's OpenBLAS kernel and,
// as *.blas_<core>, with OPENBLAS_CORETYPE naming another. That second run guards against ties
// decided by a BLAS kernel's rounding only if the variable reaches the BLAS LibTorch calls:
// OpenBLAS must report the core type asked for.
TEST(BlasKernel, TheRequestedOpenBlasCoreIsTheOneInUse) {
  using CoreName = char* (*)();
  const auto core = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (core == nullptr) GTEST_SKIP() << "LibTorch's BLAS is not OpenBLAS";
  const std::string in_use = core();
  RecordProperty("openblas_core", in_use);
  const char* requested = std::getenv("OPENBLAS_CORETYPE");
  if (requested == nullptr || *requested == 0) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE is not set; OpenBLAS chose " << in_use;
  }
  EXPECT_TRUE(absl::EqualsIgnoreCase(in_use, requested))
      << "OPENBLAS_CORETYPE=" << requested << " but OpenBLAS runs " << in_use;
}

}  // namespace
}  // namespace krause
