// Incremental decoding (prefill + one decode step at a time over the KV caches) reproduces the
// full teacher-forced forward's logits at every position, for KARM and ARM, with and without a
// start token, across the ring wrap; sequences at different positions share each step.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/engine/cpu_decoder.h"
#include "model/kv_cache.h"
#include "model/pixel_model.h"
#include "tests/test_util.h"

namespace krause {
namespace {

struct IncCase {
  const char* attention;
  bool start;
  int64_t window, prompt;
};

void PrintTo(const IncCase& c, std::ostream* os) {
  *os << c.attention << (c.start ? "_start" : "_nostart") << "_W" << c.window << "_P" << c.prompt;
}

class IncrementalDecodeTest : public ::testing::TestWithParam<IncCase> {};

TEST_P(IncrementalDecodeTest, MatchesTeacherForcedLogitsAtEveryPosition) {
  const IncCase& c = GetParam();
  PixelModelConfig cfg;
  cfg.attention = ParseAttentionKind(c.attention).value();
  cfg.height = 5;
  cfg.width_px = 4;
  cfg.channels = 2;  // 40 tokens
  cfg.d_model = 32;
  cfg.depth = 2;
  cfg.heads = 4;
  cfg.window = c.window;
  cfg.top_k = std::max<int64_t>(1, c.window * 2 / 3);
  cfg.start_token = c.start;
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(cfg, 11));
  // Give log_sigma some spread so the selection matters.
  for (auto& [name, t] : m.parameters().items()) {
    if (name.find("log_sigma") != std::string::npos) {
      at::NoGradGuard g;
      t.copy_(at::linspace(-0.5, 1.0, t.numel()).view(t.sizes()));
    }
  }
  const int64_t n = cfg.seq_len(), seqs = 3;
  // Model inputs u for 3 sequences: [START,] pixels...
  at::Tensor u = at::randint(0, 256, {seqs, n}, at::kLong);
  if (c.start) u.select(1, 0).fill_(PixelModel::kStartToken);
  at::NoGradGuard no_grad;
  const at::Tensor full = m.ForwardTokens(u, KrauseImpl::kReference);  // [S, N, 256]

  const PixelDecodeWeights packed = PackForDecode(m);
  EXPECT_TRUE(packed.linears_packed());
  EXPECT_EQ(packed.scales.size(), std::string(c.attention) == "krause" ? 2u : 0u);
  // What PackForDecode makes on a GPU: plain linear layers, the Krause layers' scales made once.
  PixelDecodeWeights scales_only;
  scales_only.scales = packed.scales;
  std::vector<at::Tensor> results;
  const std::vector<const PixelDecodeWeights*> variants = {nullptr, &packed, &scales_only};
  for (const PixelDecodeWeights* pk : variants) {
    SCOPED_TRACE(pk == nullptr          ? "at::linear"
                 : pk->linears_packed() ? "packed (batch-invariant) linears"
                                        : "at::linear, scales made once");
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelKvCache cache, PixelKvCache::Create(cfg, 5));
    at::Tensor got = at::zeros_like(full);
    // Sequence s: prefill of c.prompt + s positions, then steps; slot 4 - s.
    std::vector<int64_t> next(seqs);
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t p = std::min(n, c.prompt + s);
      if (p > 0) got[s].narrow(0, 0, p).copy_(m.Prefill(u[s].narrow(0, 0, p), 4 - s, &cache));
      next[s] = p;
    }
    while (true) {
      std::vector<int64_t> rows, tok, pos, slot;
      for (int64_t s = 0; s < seqs; ++s) {
        if (next[s] >= n) continue;
        rows.push_back(s);
        tok.push_back(u[s][next[s]].item<int64_t>());
        pos.push_back(next[s]);
        slot.push_back(4 - s);
      }
      if (rows.empty()) break;
      const at::Tensor logits = m.DecodeStep(at::tensor(tok, at::kLong), at::tensor(pos, at::kLong),
                                             at::tensor(slot, at::kLong), &cache, pk);
      for (size_t i = 0; i < rows.size(); ++i) {
        got[rows[i]][pos[i]].copy_(logits[i]);
        ++next[rows[i]];
      }
    }
    const double err = (got - full).abs().max().item<double>();
    EXPECT_LE(err, 1e-4) << "max |incremental - teacher-forced| logit difference";
    results.push_back(got);
  }
  // Scales made once or per step: the same bits.
  EXPECT_TRUE(at::equal(results[0], results[2]));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, IncrementalDecodeTest,
    ::testing::Values(IncCase{"krause", true, 8, 0}, IncCase{"krause", false, 8, 1},
                      IncCase{"krause", true, 7, 7}, IncCase{"krause", true, 8, 8},
                      IncCase{"krause", true, 8, 9}, IncCase{"krause", false, 1, 3},
                      IncCase{"krause", true, 64, 5}, IncCase{"softmax", true, 8, 0},
                      IncCase{"softmax", false, 8, 6}, IncCase{"softmax", true, 8, 20}),
    [](const ::testing::TestParamInfo<IncCase>& info) {
      std::ostringstream os;
      PrintTo(info.param, &os);
      return os.str();
    });

}  // namespace
}  // namespace krause
