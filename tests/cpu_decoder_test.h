// The packed CPU decode step's tests' shared parts (cpu_decoder_test.cc,
// cpu_decoder_prefill_test.cc): the model cases they run on, the tiny model's config, and the
// fixture that runs sequences through a whole image, packed or by the LibTorch reference step.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "model/engine/cpu_decoder.h"
#include "model/kv_cache.h"
#include "model/pixel_model.h"

namespace krause {

struct ModelCase {
  const char* attention;
  bool start;
  int64_t classes;          // > 0: class-conditional
  bool class_norm = false;  // per-class LayerNorm scale and shift
};

inline void PrintTo(const ModelCase& c, std::ostream* os) {
  *os << c.attention << (c.start ? " start" : " no start") << ", classes " << c.classes
      << (c.class_norm ? ", class_norm" : "");
}

inline PixelModelConfig Config(const std::string& attention, bool start, int64_t classes = 0,
                               bool class_norm = false) {
  PixelModelConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.height = 6;
  c.width_px = 5;
  c.channels = 2;  // 60 tokens: a window of 12 wraps several times
  c.d_model = 48;  // 3 * 48 = 144 fused q/k/v columns; MLP 192
  c.depth = 2;
  c.heads = 3;  // head dim 16
  c.window = 12;
  c.top_k = 7;
  c.start_token = start;
  c.classes = classes;
  c.class_norm = class_norm;
  return c;
}

class CpuDecoderTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  using Mode = CpuStepPlan::Mode;

  void SetUp() override {
    auto m = PixelModel::Create(
        Config(GetParam().attention, GetParam().start, GetParam().classes, GetParam().class_norm),
        21);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<PixelModel>(std::move(*m));
    at::NoGradGuard g;
    for (auto& [name, t] : model_->parameters().items()) {
      if (name.find("log_sigma") != std::string::npos) {
        t.copy_(at::linspace(-0.4, 0.8, t.numel()).view(t.sizes()));
      } else if (name.find("bias") != std::string::npos || name.find("ln") != std::string::npos) {
        t.add_(at::randn(t.sizes()) * 0.1);  // non-trivial biases and norms (class_norm's too)
      } else if (name == "class_emb.weight") {
        t.mul_(25);  // classes that change the logits clearly
      }
    }
    auto dec = CpuDecoder::Create(*model_);
    ASSERT_TRUE(dec.ok()) << dec.status();
    decoder_ = std::move(*dec);
  }

  // Runs `seqs` sequences (sequence i starts at step i % 3, in slot seqs - 1 - i) through the
  // whole image, `group` sequences per Step call, and returns logits [seqs, N, 256].
  // A conditional model: sequence i runs with class row (i + class_shift) % (classes + 1) (the
  // null class included).
  at::Tensor Run(int64_t seqs, int64_t group, std::optional<Mode> mode, bool reference = false,
                 int64_t class_shift = 0) {
    const PixelModelConfig& c = model_->config();
    const int64_t n = c.seq_len();
    auto cache = PixelKvCache::Create(c, seqs).value();
    if (c.conditional()) {
      for (int64_t i = 0; i < seqs; ++i)
        cache.SetClass(seqs - 1 - i, (i + class_shift) % (c.classes + 1));
    }
    at::Tensor out = at::zeros({seqs, n, 256});
    std::mt19937 rng(5);
    std::vector<std::vector<int64_t>> tokens(seqs);
    for (auto& t : tokens) {
      t.push_back(c.start_token ? PixelModel::kStartToken : 17);
      for (int64_t p = 1; p < n; ++p) t.push_back(static_cast<int64_t>(rng() % 256));
    }
    std::vector<int64_t> next(seqs, 0);
    at::NoGradGuard no_grad;
    for (int64_t step = 0;; ++step) {
      std::vector<int64_t> rows, u, pos, slot;
      for (int64_t i = 0; i < seqs; ++i) {
        if (step < i % 3 || next[i] >= n) continue;
        rows.push_back(i);
        u.push_back(tokens[i][next[i]]);
        pos.push_back(next[i]);
        slot.push_back(seqs - 1 - i);
      }
      if (rows.empty()) break;
      for (size_t g0 = 0; g0 < rows.size(); g0 += group) {
        const int64_t g = std::min<int64_t>(group, static_cast<int64_t>(rows.size() - g0));
        at::Tensor logits;
        if (reference) {
          logits = model_->DecodeStep(
              at::tensor(std::vector<int64_t>(u.begin() + g0, u.begin() + g0 + g)),
              at::tensor(std::vector<int64_t>(pos.begin() + g0, pos.begin() + g0 + g)),
              at::tensor(std::vector<int64_t>(slot.begin() + g0, slot.begin() + g0 + g)), &cache);
        } else {
          logits = at::empty({g, 256});
          const absl::Status st = decoder_->Step(&u[g0], &pos[g0], &slot[g0], g, &cache,
                                                 logits.data_ptr<float>(), mode);
          EXPECT_TRUE(st.ok()) << st;
        }
        for (int64_t r = 0; r < g; ++r) out[rows[g0 + r]][pos[g0 + r]].copy_(logits[r]);
      }
      for (int64_t i : rows) ++next[i];
    }
    return out;
  }

  std::unique_ptr<PixelModel> model_;
  std::unique_ptr<CpuDecoder> decoder_;
};

// The model cases every CpuDecoderTest runs on, and their names in the tests' names.
inline std::vector<ModelCase> ModelCases() {
  return {ModelCase{"krause", true, 0},       ModelCase{"krause", false, 0},
          ModelCase{"softmax", true, 0},      ModelCase{"krause", true, 4},
          ModelCase{"softmax", true, 4},      ModelCase{"krause", true, 4, true},
          ModelCase{"softmax", true, 4, true}};
}

inline std::string ModelCaseName(const ::testing::TestParamInfo<ModelCase>& info) {
  return std::string(info.param.attention) + (info.param.start ? "_start" : "_nostart") +
         (info.param.classes > 0 ? "_conditional" : "") +
         (info.param.class_norm ? "_class_norm" : "");
}

}  // namespace krause
