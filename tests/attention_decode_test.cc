// The batched decode step (ring-buffer caches) against the causal prefill: driven one token at a
// time, every position's output equals the prefill's, across the ring wrap (N = W-1, W, W+1 and
// several wraps), with sequences at different positions sharing one step.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "model/attention/decode.h"
#include "model/attention/krause_attention.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::RelativeMaxError;
using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

struct DecodeCase {
  int64_t window, n, top_k, heads, head_dim;
};

void PrintTo(const DecodeCase& c, std::ostream* os) {
  *os << "W" << c.window << "_N" << c.n << "_k" << c.top_k << "_H" << c.heads << "_d" << c.head_dim;
}

class DecodeParityTest : public ::testing::TestWithParam<DecodeCase> {
 protected:
  void TearDown() override { cpu::SetCpuKernelsForTesting(nullptr); }
};

// Decodes `seqs` sequences of length n through one cache; sequence s starts s * stagger steps
// late, so one step mixes positions. Returns the outputs [S, H, n, d] and selections.
void DecodeAll(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& log_sigma, int64_t window, int64_t top_k, int64_t stagger,
               at::Tensor* out, at::Tensor* sel) {
  const int64_t seqs = q.size(0), h = q.size(1), n = q.size(2), d = q.size(3);
  auto cache_or = KrauseRingCache::Create(seqs + 2, h, d, window);
  ASSERT_TRUE(cache_or.ok());
  KrauseRingCache cache = std::move(cache_or).value();
  *out = at::zeros({seqs, h, n, d});
  *sel = at::full({seqs, h, n, std::min(top_k, window)}, -2, at::kLong);
  const int64_t steps = n + stagger * (seqs - 1);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<int64_t> active, slots, pos;
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t p = step - s * stagger;
      if (p < 0 || p >= n) continue;
      active.push_back(s);
      slots.push_back(seqs + 1 - s);  // not the identity, to catch slot mix-ups
      pos.push_back(p);
    }
    const at::Tensor idx = at::tensor(active, at::kLong);
    const at::Tensor pos_t = at::tensor(pos, at::kLong);
    auto gather = [&](const at::Tensor& x) {
      // x: [S, H, n, d] -> [active, H, d] at each active sequence's position
      return x.index_select(0, idx)
          .gather(2, pos_t.view({-1, 1, 1, 1}).expand({-1, h, 1, d}))
          .squeeze(2);
    };
    DecodeSelection selection;
    auto r = KrauseDecodeStep(gather(q), gather(k), gather(v), log_sigma, top_k,
                              at::tensor(slots, at::kLong), pos_t, &cache, &selection);
    ASSERT_TRUE(r.ok()) << r.status();
    for (size_t a = 0; a < active.size(); ++a) {
      out->select(0, active[a]).select(1, pos[a]).copy_(r->select(0, a));
      sel->select(0, active[a]).select(1, pos[a]).copy_(selection.indices.select(0, a));
    }
  }
}

TEST_P(DecodeParityTest, StepByStepEqualsCausalPrefill) {
  const DecodeCase& c = GetParam();
  at::Generator gen = at::detail::createCPUGenerator(c.n * 31 + c.window);
  const int64_t seqs = 3;
  const at::Tensor q = at::normal(0, 0.4, {seqs, c.heads, c.n, c.head_dim}, gen).to(at::kFloat);
  const at::Tensor k = at::normal(0, 0.4, {seqs, c.heads, c.n, c.head_dim}, gen).to(at::kFloat);
  const at::Tensor v = at::normal(0, 1.0, {seqs, c.heads, c.n, c.head_dim}, gen).to(at::kFloat);
  const at::Tensor ls = at::full({c.heads}, 0.1f);

  KrauseOptions opts;
  opts.neighbourhood = Neighbourhood::Causal(c.window);
  opts.top_k = c.top_k;
  opts.return_selection = true;
  opts.impl = KrauseImpl::kReference;
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult ref, KrauseAttention(q, k, v, ls, opts));
  opts.impl = KrauseImpl::kFusedCpu;

  for (int vi = 0; vi < cpu::NumCpuKernelVariants(); ++vi) {
    SCOPED_TRACE(cpu::CpuKernelVariantName(vi));
    ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(vi)));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult fused, KrauseAttention(q, k, v, ls, opts));
    at::Tensor out, sel;
    DecodeAll(q, k, v, ls, c.window, c.top_k, /*stagger=*/c.window / 2 + 1, &out, &sel);
    // Same kernel family: bit-for-bit equal to the fused prefill, selections included.
    EXPECT_TRUE(at::equal(out, fused.out)) << "max diff " << (out - fused.out).abs().max();
    const int64_t kcols = std::min(c.top_k, c.window);
    EXPECT_TRUE(at::equal(sel, fused.indices.narrow(3, 0, kcols)));
    // And within the fp32 tolerance of the reference.
    EXPECT_LE(RelativeMaxError(out, ref.out), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeParityTest,
                         ::testing::Values(DecodeCase{4, 3, 2, 2, 16},     // N = W - 1
                                           DecodeCase{4, 4, 2, 2, 16},     // N = W
                                           DecodeCase{4, 5, 3, 1, 32},     // N = W + 1
                                           DecodeCase{1, 6, 1, 2, 16},     // W = 1
                                           DecodeCase{16, 53, 5, 2, 64},   // several wraps
                                           DecodeCase{16, 40, 20, 1, 16},  // k > W
                                           DecodeCase{128, 129, 96, 2, 32},
                                           DecodeCase{33, 100, 1, 3, 16}),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           std::ostringstream os;
                           PrintTo(info.param, &os);
                           return os.str();
                         });

TEST(DecodeStep, BadArgumentsNameTheArgumentAndLeaveTheCacheAlone) {
  auto cache_or = KrauseRingCache::Create(2, 2, 8, 4);
  ASSERT_TRUE(cache_or.ok());
  KrauseRingCache cache = std::move(cache_or).value();
  const at::Tensor before = cache.keys_t().clone();
  const at::Tensor x = at::ones({2, 2, 8});
  const at::Tensor ls = at::zeros({});
  const at::Tensor good_slots = at::tensor({0, 1}, at::kLong);
  const at::Tensor pos = at::tensor({0, 3}, at::kLong);
  using krause::testing::StatusOf;
  EXPECT_THAT(
      StatusOf(KrauseDecodeStep(x, x, x, ls, 2, at::tensor({0, 0}, at::kLong), pos, &cache)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("appears twice")));
  EXPECT_THAT(
      StatusOf(KrauseDecodeStep(x, x, x, ls, 2, at::tensor({0, 2}, at::kLong), pos, &cache)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots[1]")));
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, x, x, ls, 2, good_slots, at::tensor({0, -1}, at::kLong),
                                        &cache)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positions[1]")));
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, x, x, ls, 0, good_slots, pos, &cache)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")));
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, at::ones({2, 2, 7}), x, ls, 2, good_slots, pos, &cache)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k must have shape")));
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, x, x, at::full({}, NAN), 2, good_slots, pos, &cache)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("log_sigma")));
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, x, x, ls, 2, good_slots, pos, nullptr)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cache")));
  EXPECT_TRUE(at::equal(cache.keys_t(), before));
  EXPECT_THAT(KrauseRingCache::Create(1, 1, 1, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("window")));
}

TEST(DecodeStep, OneIndexServesEveryLayerOfAStep) {
  // Two layers' caches stepped with one shared DecodeIndex give the bits of the per-call form.
  constexpr int64_t kSlots = 3, kHeads = 2, kDim = 8, kWindow = 4;
  std::vector<KrauseRingCache> shared, per_call;
  for (int layer = 0; layer < 2; ++layer) {
    shared.push_back(KrauseRingCache::Create(kSlots, kHeads, kDim, kWindow).value());
    per_call.push_back(KrauseRingCache::Create(kSlots, kHeads, kDim, kWindow).value());
  }
  at::manual_seed(5);
  const at::Tensor ls = at::full({kHeads}, 0.3);
  KRAUSE_ASSERT_OK_AND_ASSIGN(const DecodeScale scale,
                              DecodeScale::Create(ls, kHeads, at::Device(at::kCPU)));
  const at::Tensor slots = at::tensor({2, 0}, at::kLong);
  for (int64_t step = 0; step < 6; ++step) {
    const at::Tensor positions = at::tensor({step, step + 1}, at::kLong);
    auto index = DecodeIndex::Create(slots, positions, kSlots, at::Device(at::kCPU));
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(index->size(), 2);
    for (int layer = 0; layer < 2; ++layer) {
      const at::Tensor q = at::randn({2, kHeads, kDim}), k = at::randn({2, kHeads, kDim}),
                       v = at::randn({2, kHeads, kDim});
      auto a = KrauseDecodeStep(q, k, v, scale, 3, *index, &shared[layer]);
      auto b = KrauseDecodeStep(q, k, v, ls, 3, slots, positions, &per_call[layer]);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_TRUE(at::equal(*a, *b)) << "step " << step << " layer " << layer;
    }
  }
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_TRUE(at::equal(shared[layer].keys_t(), per_call[layer].keys_t()));
    EXPECT_TRUE(at::equal(shared[layer].values(), per_call[layer].values()));
  }
}

TEST(DecodeStep, AnIndexMustFitTheStepAndTheCache) {
  KrauseRingCache cache = KrauseRingCache::Create(2, 2, 8, 4).value();
  const at::Tensor before = cache.keys_t().clone();
  const at::Tensor x = at::ones({2, 2, 8});
  using krause::testing::StatusOf;
  const at::Device cpu(at::kCPU);
  KRAUSE_ASSERT_OK_AND_ASSIGN(const DecodeScale ls, DecodeScale::Create(at::zeros({}), 2, cpu));
  // S of the index differs from q's.
  auto one = DecodeIndex::Create(at::tensor({0}, at::kLong), at::tensor({0}, at::kLong), 2, cpu);
  ASSERT_TRUE(one.ok());
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, x, x, ls, 2, *one, &cache)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[S] = [2]")));
  // Made for a cache of another slot count.
  auto other =
      DecodeIndex::Create(at::tensor({0, 1}, at::kLong), at::tensor({0, 0}, at::kLong), 5, cpu);
  ASSERT_TRUE(other.ok());
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, x, x, ls, 2, *other, &cache)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("index was made for")));
  EXPECT_TRUE(at::equal(cache.keys_t(), before));
  // Adopting device copies: they must match the host values' shape and be int64.
  const at::Tensor sl = at::tensor({0, 1}, at::kLong), po = at::tensor({0, 0}, at::kLong);
  KRAUSE_ASSERT_OK_AND_ASSIGN(const DecodeIndex adopted,
                              DecodeIndex::Adopt(sl, po, 2, sl.clone(), po.clone()));
  EXPECT_EQ(adopted.size(), 2);
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor out, KrauseDecodeStep(x, x, x, ls, 2, adopted, &cache));
  EXPECT_EQ(out.sizes(), x.sizes());
  EXPECT_THAT(DecodeIndex::Adopt(sl, po, 2, at::tensor({0}, at::kLong), po).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_slots")));
  EXPECT_THAT(DecodeIndex::Adopt(sl, po, 2, sl, po.to(at::kInt)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_positions")));
  EXPECT_THAT(DecodeIndex::Adopt(at::tensor({0, 5}, at::kLong), po, 2, sl, po).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots[1] = 5")));
  // The index's own checks.
  EXPECT_THAT(DecodeIndex::Create(at::tensor({0, 1}, at::kLong), at::tensor({0}, at::kLong), 2, cpu)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positions")));
  EXPECT_THAT(
      DecodeIndex::Create(at::tensor({0, 1}, at::kInt), at::tensor({0, 0}, at::kLong), 2, cpu)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots")));
  EXPECT_THAT(
      DecodeIndex::Create(at::tensor({1, 2}, at::kLong), at::tensor({0, 0}, at::kLong), 2, cpu)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots[1] = 2")));
}

TEST(DecodeStep, AScaleIsValidatedOnceAndMustFitTheLayer) {
  KrauseRingCache cache = KrauseRingCache::Create(2, 2, 8, 4).value();
  const at::Tensor before = cache.keys_t().clone();
  const at::Tensor x = at::ones({2, 2, 8});
  const at::Device cpu(at::kCPU);
  using krause::testing::StatusOf;
  auto index =
      DecodeIndex::Create(at::tensor({0, 1}, at::kLong), at::tensor({0, 3}, at::kLong), 2, cpu);
  ASSERT_TRUE(index.ok());
  EXPECT_THAT(DecodeScale::Create(at::full({2}, NAN), 2, cpu).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("log_sigma")));
  EXPECT_THAT(DecodeScale::Create(at::zeros({3}), 2, cpu).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("log_sigma")));
  EXPECT_THAT(DecodeScale::Create(at::full({}, -100.0), 2, cpu).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  // Made for 4 heads, used on a 2-head cache; and a default (empty) scale.
  auto four = DecodeScale::Create(at::zeros({}), 4, cpu);
  ASSERT_TRUE(four.ok());
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, x, x, *four, 2, *index, &cache)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("H = 2")));
  EXPECT_THAT(StatusOf(KrauseDecodeStep(x, x, x, DecodeScale(), 2, *index, &cache)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale")));
  EXPECT_TRUE(at::equal(cache.keys_t(), before));
  // A shared log_sigma becomes one value per head: exp(-2 * 0.5) each.
  auto shared = DecodeScale::Create(at::full({}, 0.5), 2, cpu);
  ASSERT_TRUE(shared.ok());
  EXPECT_TRUE(at::equal(shared->inv_var(), at::exp(at::full({2}, -1.0))));
}

// bf16 rings serve on the CPU (any window) and on a GPU; fp16 rings only on a GPU, where 2-byte
// rings need W <= 256 (the CUDA decode kernel's).
TEST(DecodeStep, HalfCachesNeedAGpuBf16OnesServeOnTheCpu) {
  const at::Device cpu(at::kCPU);
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache bf16,
                              KrauseRingCache::Create(2, 2, 8, 300, cpu, at::kBFloat16));
  EXPECT_EQ(bf16.dtype(), at::kBFloat16);
  EXPECT_EQ(bf16.bytes_per_slot(), KrauseRingCache::BytesPerSlot(2, 8, 300, at::kBFloat16));
  EXPECT_THAT(KrauseRingCache::Create(2, 2, 8, 4, cpu, at::kHalf).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CUDA device")));
  EXPECT_THAT(KrauseRingCache::Create(2, 2, 8, 4, cpu, at::kInt).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float32, bfloat16")));
  EXPECT_THAT(KrauseRingCache::Create(2, 2, 8, 300, at::Device(at::kCUDA), at::kHalf).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("window <= 256")));
  // Keys and values at 2 bytes, biases at 4: W 256, d 64, 8 heads.
  EXPECT_EQ(KrauseRingCache::BytesPerSlot(8, 64, 256, at::kBFloat16),
            8 * ((64 * 256 + 256 * 64) * 2 + 256 * 4));
  EXPECT_EQ(KrauseRingCache::Create(1, 8, 64, 256).value().bytes_per_slot(),
            KrauseRingCache::BytesPerSlot(8, 64, 256));
}

// x as a bf16 ring stores it, back in fp32 (exact).
at::Tensor Bf16Values(const at::Tensor& x) { return x.to(at::kBFloat16).to(at::kFloat); }

// A bf16 ring is, bit for bit, an fp32 ring fed the keys and values rounded to bf16: the kernel
// rounds each new element to nearest even (as LibTorch does), its bias is the rounded key's, and
// the step computes in fp32 on the widened elements in the fp32 ring's order. Several sequences
// at different positions, across ring wraps, in every kernel variant; selections included. The
// LibTorch step over a bf16 ring stores the same elements and agrees within 1e-5.
TEST(DecodeStep, ABf16RingIsTheFp32RingFedTheRoundedKeysAndValues) {
  const int64_t h = 2, d = 32, w = 20, top_k = 7, slots = 3, steps = 47;
  at::Generator gen = at::detail::createCPUGenerator(23);
  const at::Tensor log_sigma = at::tensor({0.2f, -0.1f});
  for (int vi = 0; vi < cpu::NumCpuKernelVariants(); ++vi) {
    SCOPED_TRACE(cpu::CpuKernelVariantName(vi));
    ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(vi)));
    const at::Device dev(at::kCPU);
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache bf16,
                                KrauseRingCache::Create(slots, h, d, w, dev, at::kBFloat16));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache fp32, KrauseRingCache::Create(slots, h, d, w));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache lib,
                                KrauseRingCache::Create(slots, h, d, w, dev, at::kBFloat16));
    KRAUSE_ASSERT_OK_AND_ASSIGN(DecodeScale scale, DecodeScale::Create(log_sigma, h, dev));
    const at::Tensor slot_ids = at::tensor({2, 0, 1}, at::kLong);
    for (int64_t t = 0; t < steps; ++t) {
      const at::Tensor positions = at::tensor({t, t + 5, t + 11}, at::kLong);
      const at::Tensor q = at::randn({slots, h, d}, gen) * 0.3;
      at::Tensor k = at::randn({slots, h, d}, gen) * 0.3;
      const at::Tensor v = at::randn({slots, h, d}, gen);
      if (t == 3) {                         // exact halfway cases: ties round to the even neighbour
        k[0][0][0] = 1.0f + 1.0f / 256;     // -> 1
        k[0][0][1] = 1.0f + 3.0f / 256;     // -> 1 + 4 / 256
        k[0][0][2] = -(1.0f + 5.0f / 256);  // -> -(1 + 4 / 256)
        k[0][0][3] = 3.0e38f;               // finite in bf16 too; its bias -inf, its weight 0
      }
      KRAUSE_ASSERT_OK_AND_ASSIGN(DecodeIndex index,
                                  DecodeIndex::Create(slot_ids, positions, slots, dev));
      DecodeSelection sel_bf16, sel_fp32;
      KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor out_bf16,
                                  KrauseDecodeStep(q, k, v, scale, top_k, index, &bf16, &sel_bf16));
      KRAUSE_ASSERT_OK_AND_ASSIGN(
          at::Tensor out_fp32,
          KrauseDecodeStep(q, Bf16Values(k), Bf16Values(v), scale, top_k, index, &fp32, &sel_fp32));
      KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor out_lib,
                                  KrauseDecodeStepLibTorch(q, k, v, scale, top_k, index, &lib));
      EXPECT_TRUE(at::equal(out_bf16, out_fp32)) << "step " << t;
      EXPECT_TRUE(at::equal(sel_bf16.indices, sel_fp32.indices)) << "step " << t;
      EXPECT_TRUE(at::equal(sel_bf16.weights, sel_fp32.weights)) << "step " << t;
      EXPECT_LE((out_bf16 - out_lib).abs().max().item<double>(), 1e-5) << "step " << t;
    }
    EXPECT_TRUE(at::equal(bf16.keys_t().to(at::kFloat), fp32.keys_t()));
    EXPECT_TRUE(at::equal(bf16.values().to(at::kFloat), fp32.values()));
    EXPECT_TRUE(at::equal(bf16.bias(), fp32.bias()));
    // LibTorch rounds the same way; on the CPU its biases are the kernel's sums
    // (internal::StoredKeyBiases), so one key has one bias whichever step stored it.
    EXPECT_TRUE(at::equal(bf16.keys_t(), lib.keys_t()));
    EXPECT_TRUE(at::equal(bf16.values(), lib.values()));
    EXPECT_TRUE(at::equal(bf16.bias(), lib.bias()));
  }
  cpu::SetCpuKernelsForTesting(nullptr);
}

// Keys and queries drawn with replacement from a few vectors, so every window holds many
// identical keys: the LibTorch step must keep the CPU step's keys, step by step. Both score each
// (query, key) pair by itself, so identical keys tie exactly and the tie rule decides; a score
// taken from a matrix product did not (its rounding depends on the BLAS kernel and on where the
// key falls in its blocking). The values are Gaussian: another kept key would move the output
// far more than 1e-5.
TEST(DecodeStep, TheLibTorchStepKeepsTheCpuStepsKeysAmongIdenticalOnes) {
  const int64_t h = 2, d = 16, w = 128, slots = 2, steps = 300, distinct = 40;
  at::Generator gen = at::detail::createCPUGenerator(31);
  const at::Tensor protos = at::randn({distinct, d}, gen);
  const at::Tensor log_sigma = at::tensor({0.3f, -0.2f});
  const at::Device dev(at::kCPU);
  KRAUSE_ASSERT_OK_AND_ASSIGN(DecodeScale scale, DecodeScale::Create(log_sigma, h, dev));
  const at::Tensor slot_ids = at::tensor({1, 0}, at::kLong);
  auto draw = [&] {
    return protos.index_select(0, at::randint(0, distinct, {slots * h}, gen)).view({slots, h, d});
  };
  for (const int64_t top_k : {int64_t{1}, int64_t{37}, int64_t{127}}) {
    SCOPED_TRACE(absl::StrCat("top_k ", top_k));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache fused, KrauseRingCache::Create(slots, h, d, w));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache lib, KrauseRingCache::Create(slots, h, d, w));
    int64_t differ = 0;
    for (int64_t t = 0; t < steps; ++t) {
      const at::Tensor positions = at::tensor({t, t}, at::kLong);
      const at::Tensor q = draw(), k = draw(), v = at::randn({slots, h, d}, gen);
      KRAUSE_ASSERT_OK_AND_ASSIGN(DecodeIndex index,
                                  DecodeIndex::Create(slot_ids, positions, slots, dev));
      KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor want,
                                  KrauseDecodeStep(q, k, v, scale, top_k, index, &fused));
      KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor got,
                                  KrauseDecodeStepLibTorch(q, k, v, scale, top_k, index, &lib));
      differ += (want - got).abs().max().item<double>() > 1e-5;
    }
    EXPECT_EQ(differ, 0) << "steps whose LibTorch output is not the CPU step's";
  }
}

TEST(DecodeStep, MemoryPerSequenceIsIndependentOfPosition) {
  auto cache = KrauseRingCache::Create(1, 8, 64, 256);
  ASSERT_TRUE(cache.ok());
  // keys (transposed, padded to 16) + values + biases, fp32.
  EXPECT_EQ(cache->bytes_per_slot(), 8 * (64 * 256 + 256 * 64 + 256) * 4);
}

}  // namespace
}  // namespace krause
