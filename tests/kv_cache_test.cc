// The per-layer KV caches (model/kv_cache.h) on their own, without a model:
// - a prefix written by WritePrefix plus decode steps through Attend give, at every position, the
//   attention the full-sequence operator computes (KrauseAttention with causal(W) and top-k for
//   the Krause ring; a causal softmax for the full-length cache), across the ring's wrap;
// - AttendRow (the packed CPU step's path) gives Attend's output and leaves the same storage:
//   bit for bit for the Krause ring (one kernel), within float rounding for the softmax cache;
// - bad arguments are refused by name and change nothing; PixelKvCache builds one layer cache
//   of the model's kind per layer, with BytesPerSequence equal to the storage it allocates;
// - a large cache's storage is advised for huge pages (the mapping's VmFlags say "hg").
#include "model/kv_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "model/attention/krause_attention.h"
#include "model/nn/packed.h"
#include "model/util/huge_pages.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kHeads = 2, kDim = 8, kLen = 20;

struct Sequence {
  at::Tensor q, k, v;  // [H, N, d]
};

Sequence RandomSequence(uint64_t seed) {
  at::manual_seed(seed);
  return {at::randn({kHeads, kLen, kDim}), at::randn({kHeads, kLen, kDim}),
          at::randn({kHeads, kLen, kDim})};
}

at::Tensor LogSigma() { return at::tensor({0.3f, -0.2f}); }

// What the full-sequence operator gives at every position: [H, N, d].
at::Tensor FullAttention(AttentionKind kind, const Sequence& s, int64_t window, int64_t top_k) {
  if (kind == AttentionKind::kKrause) {
    KrauseOptions o;
    o.neighbourhood = Neighbourhood::Causal(window);
    o.top_k = top_k;
    o.impl = KrauseImpl::kReference;
    auto r = KrauseAttention(s.q.unsqueeze(0), s.k.unsqueeze(0), s.v.unsqueeze(0), LogSigma(), o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->out[0];
  }
  const at::Tensor scores = at::matmul(s.q, s.k.transpose(1, 2)) / std::sqrt(double{kDim});
  const at::Tensor later = at::ones({kLen, kLen}, at::kBool).triu(1);
  return at::matmul(at::softmax(scores.masked_fill(later, -INFINITY), -1), s.v);
}

std::unique_ptr<LayerKvCache> MakeCache(AttentionKind kind, int64_t slots, int64_t window,
                                        int64_t top_k) {
  if (kind == AttentionKind::kKrause) {
    return KrauseLayerCache::Create(slots, kHeads, kDim, window, top_k, at::Device(at::kCPU),
                                    at::kFloat)
        .value();
  }
  return SoftmaxLayerCache::Create(slots, kHeads, kDim, kLen, at::Device(at::kCPU)).value();
}

struct CacheCase {
  AttentionKind kind;
  int64_t window, top_k, prefix;
};

void PrintTo(const CacheCase& c, std::ostream* os) {
  *os << AttentionKindName(c.kind) << "_W" << c.window << "_k" << c.top_k << "_P" << c.prefix;
}

class LayerKvCacheTest : public ::testing::TestWithParam<CacheCase> {};

// Two sequences in slots 2 and 0 of a 3-slot cache, stepped together from `prefix` on.
TEST_P(LayerKvCacheTest, PrefixAndStepsReproduceTheFullSequenceAttention) {
  const CacheCase& c = GetParam();
  const std::vector<Sequence> seqs = {RandomSequence(1), RandomSequence(2)};
  const std::vector<int64_t> slot_of = {2, 0};
  std::unique_ptr<LayerKvCache> cache = MakeCache(c.kind, 3, c.window, c.top_k);
  auto scale = DecodeScale::Create(LogSigma(), kHeads, at::Device(at::kCPU)).value();
  for (size_t i = 0; i < seqs.size(); ++i) {
    cache->WritePrefix(slot_of[i], seqs[i].k.narrow(1, 0, c.prefix),
                       seqs[i].v.narrow(1, 0, c.prefix));
  }
  std::vector<at::Tensor> full;
  for (const Sequence& s : seqs) full.push_back(FullAttention(c.kind, s, c.window, c.top_k));
  const double tol = 1e-5;
  for (int64_t p = c.prefix; p < kLen; ++p) {
    auto index = DecodeIndex::Create(at::tensor({slot_of[0], slot_of[1]}), at::tensor({p, p}), 3,
                                     at::Device(at::kCPU))
                     .value();
    auto at_p = [&](const at::Tensor Sequence::*t) {
      return at::stack({(seqs[0].*t).select(1, p), (seqs[1].*t).select(1, p)});  // [S, H, d]
    };
    KRAUSE_ASSERT_OK_AND_ASSIGN(
        at::Tensor out,
        cache->Attend(at_p(&Sequence::q), at_p(&Sequence::k), at_p(&Sequence::v), index, &scale));
    for (int i = 0; i < 2; ++i) {
      const at::Tensor want = full[i].select(1, p);
      EXPECT_TRUE(at::allclose(out[i], want, tol, tol))
          << "sequence " << i << " position " << p << ": "
          << (out[i] - want).abs().max().item<float>();
    }
  }
}

TEST_P(LayerKvCacheTest, AttendRowMatchesAttend) {
  const CacheCase& c = GetParam();
  const Sequence s = RandomSequence(3);
  std::unique_ptr<LayerKvCache> by_tensor = MakeCache(c.kind, 2, c.window, c.top_k);
  std::unique_ptr<LayerKvCache> by_row = MakeCache(c.kind, 2, c.window, c.top_k);
  auto scale = DecodeScale::Create(LogSigma(), kHeads, at::Device(at::kCPU)).value();
  const std::vector<float> inv_var = nn::Floats(scale.inv_var());
  for (LayerKvCache* cache : {by_tensor.get(), by_row.get()}) {
    cache->WritePrefix(1, s.k.narrow(1, 0, c.prefix), s.v.narrow(1, 0, c.prefix));
  }
  const bool exact = c.kind == AttentionKind::kKrause;
  for (int64_t p = c.prefix; p < kLen; ++p) {
    auto index =
        DecodeIndex::Create(at::tensor({int64_t{1}}), at::tensor({p}), 2, at::Device(at::kCPU))
            .value();
    const at::Tensor q = s.q.select(1, p).contiguous(), k = s.k.select(1, p).contiguous(),
                     v = s.v.select(1, p).contiguous();  // [H, d]
    KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor want, by_tensor->Attend(q.unsqueeze(0), k.unsqueeze(0),
                                                                   v.unsqueeze(0), index, &scale));
    at::Tensor got = at::empty({kHeads, kDim});
    for (int64_t h = 0; h < kHeads; ++h) {
      DecodeRow row;
      row.slot = 1;
      row.head = h;
      row.position = p;
      row.q = q[h].data_ptr<float>();
      row.k = k[h].data_ptr<float>();
      row.v = v[h].data_ptr<float>();
      row.inv_var = inv_var[h];
      row.out = got[h].data_ptr<float>();
      by_row->AttendRow(row, nn::ThreadScratch::Get());
    }
    if (exact) {
      EXPECT_TRUE(at::equal(got, want[0])) << "position " << p;
    } else {
      EXPECT_TRUE(at::allclose(got, want[0], 1e-5, 1e-6)) << "position " << p;
    }
  }
  const std::vector<at::Tensor> a = by_tensor->Storage(), b = by_row->Storage();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "storage " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, LayerKvCacheTest,
    ::testing::Values(CacheCase{AttentionKind::kKrause, 6, 4, 3},    // the ring wraps
                      CacheCase{AttentionKind::kKrause, 6, 4, 9},    // prefix longer than W
                      CacheCase{AttentionKind::kKrause, 32, 32, 1},  // W > N: never wraps
                      CacheCase{AttentionKind::kSoftmax, 0, 0, 1},
                      CacheCase{AttentionKind::kSoftmax, 0, 0, 7}));

TEST(LayerKvCacheErrors, BadArgumentsAreRefusedByNameAndChangeNothing) {
  const at::Device cpu(at::kCPU);
  auto index =
      DecodeIndex::Create(at::tensor({int64_t{0}}), at::tensor({int64_t{0}}), 2, cpu).value();
  const at::Tensor x = at::randn({1, kHeads, kDim});

  std::unique_ptr<LayerKvCache> ring = MakeCache(AttentionKind::kKrause, 2, 4, 2);
  EXPECT_THAT(ring->Attend(x, x, x, index, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("DecodeScale")));
  EXPECT_THAT(KrauseLayerCache::Create(2, kHeads, kDim, 4, 0, cpu, at::kFloat).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")));

  std::unique_ptr<LayerKvCache> full = MakeCache(AttentionKind::kSoftmax, 2, 0, 0);
  const std::vector<at::Tensor> before = {full->Storage()[0].clone(), full->Storage()[1].clone()};
  auto beyond = DecodeIndex::Create(at::tensor({int64_t{0}}), at::tensor({kLen}), 2, cpu).value();
  EXPECT_THAT(full->Attend(x, x, x, beyond, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positions[0] = 20")));
  EXPECT_THAT(full->Attend(at::randn({1, kHeads, kDim + 1}), x, x, index, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[S, H, d] = [1, 2, 8]")));
  auto other =
      DecodeIndex::Create(at::tensor({int64_t{0}}), at::tensor({int64_t{0}}), 3, cpu).value();
  EXPECT_THAT(full->Attend(x, x, x, other, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 slots")));
  EXPECT_TRUE(at::equal(full->Storage()[0], before[0]));
  EXPECT_TRUE(at::equal(full->Storage()[1], before[1]));
  EXPECT_THAT(SoftmaxLayerCache::Create(2, kHeads, kDim, 0, cpu).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("seq_len 0")));
}

TEST(PixelKvCacheTest, OneLayerCacheOfTheModelsKindPerLayerSizedAsAdvertised) {
  PixelModelConfig c;
  c.height = 4;
  c.width_px = 5;
  c.d_model = 16;
  c.heads = 2;
  c.depth = 3;
  c.window = 7;
  c.top_k = 3;
  for (AttentionKind kind : {AttentionKind::kKrause, AttentionKind::kSoftmax}) {
    SCOPED_TRACE(AttentionKindName(kind));
    c.attention = kind;
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelKvCache cache, PixelKvCache::Create(c, 3));
    EXPECT_EQ(cache.kind(), kind);
    EXPECT_EQ(cache.slots(), 3);
    ASSERT_EQ(cache.layers(), 3);
    int64_t bytes = 0;
    for (int64_t l = 0; l < cache.layers(); ++l) {
      EXPECT_EQ(cache.layer(l).kind(), kind);
      EXPECT_EQ(cache.layer(l).heads(), 2);
      EXPECT_EQ(cache.layer(l).head_dim(), 8);
      EXPECT_EQ(cache.layer(l).length(), kind == AttentionKind::kKrause ? 7 : 20);
      for (const at::Tensor& t : cache.layer(l).Storage()) bytes += t.nbytes();
    }
    EXPECT_EQ(bytes, 3 * PixelKvCache::BytesPerSequence(c));
    EXPECT_FALSE(cache.conditional());
  }
  c.classes = 4;
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelKvCache conditional, PixelKvCache::Create(c, 2));
  EXPECT_TRUE(conditional.conditional());
  EXPECT_EQ(conditional.slot_class(1), 4);  // the null class until a sequence sets one
  conditional.SetClass(1, 2);
  EXPECT_EQ(conditional.slot_class(1), 2);
  EXPECT_EQ(conditional.slot_classes()[1].item<int64_t>(), 2);
  EXPECT_THAT(PixelKvCache::Create(c, 2, at::Device(at::kCPU), at::kBFloat16).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float32")));
  EXPECT_THAT(PixelKvCache::Create(c, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots must be >= 1")));
}

// The VmFlags of the mapping holding `address` (/proc/self/smaps), or "" when none is found.
std::string VmFlagsAt(const void* address) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long long begin = 0, end = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%llx%c%llx", &begin, &dash, &end) == 3 && dash == '-') {
      inside = a >= begin && a < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(HugePages, ZerosOnHugePagesIsAtZeros) {
  const auto opts = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor t = ZerosOnHugePages({3, 1 << 20}, opts);  // 6 MiB: whole 2 MiB pages inside
  EXPECT_EQ(t.sizes(), at::IntArrayRef({3, 1 << 20}));
  EXPECT_EQ(t.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(at::equal(t, at::zeros({3, 1 << 20}, opts)));
  const at::Tensor small = ZerosOnHugePages({5}, at::TensorOptions().dtype(at::kFloat));
  EXPECT_TRUE(at::equal(small, at::zeros({5})));
  // No whole 2 MiB page in 4 KiB: nothing to advise.
  std::vector<char> page(4096);
  EXPECT_FALSE(AdviseHugePages(page.data(), page.size()));
  EXPECT_FALSE(AdviseHugePages(nullptr, 8 << 20));
}

TEST(HugePages, LargeCachesOfBothKindsAreAdvised) {
  {
    const at::Tensor probe = at::empty({8 << 20}, at::kByte);
    if (!AdviseHugePages(probe.data_ptr(), probe.nbytes()) || VmFlagsAt(probe.data_ptr()).empty()) {
      GTEST_SKIP() << "this kernel has no transparent huge pages or no /proc/self/smaps";
    }
  }
  PixelModelConfig c;
  c.height = c.width_px = 28;
  c.d_model = 256;
  c.heads = 8;
  c.depth = 1;
  c.window = 128;
  c.top_k = 96;
  for (AttentionKind kind : {AttentionKind::kKrause, AttentionKind::kSoftmax}) {
    SCOPED_TRACE(AttentionKindName(kind));
    c.attention = kind;
    // 40 slots: ring keys and values of 5 MiB each, a softmax cache's of 31 MiB.
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelKvCache cache, PixelKvCache::Create(c, 40));
    for (const at::Tensor& t : cache.layer(0).Storage()) {
      if (t.nbytes() < (4u << 20)) continue;  // the ring's biases
      // A byte 2 MiB in lies inside a whole huge page of the advised range.
      const char* inside = static_cast<const char*>(t.data_ptr()) + (2u << 20);
      EXPECT_THAT(VmFlagsAt(inside), HasSubstr(" hg")) << t.nbytes() << " bytes";
    }
  }
}

}  // namespace
}  // namespace krause
