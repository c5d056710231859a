// CpuDecoder's construction (cpu_decoder.h): the model's weights packed once for the CPU step
// (fp32 panels, and in the bf16 precision oneDNN bf16 GEMMs beside them), its layer norms and
// caches' shapes checked, and PackForDecode, which the decode engine calls. Apart from the step
// itself (cpu_decoder.cc) so that each file holds one job.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/engine/cpu_decoder.h"
#include "model/nn/packed.h"
#include "model/pixel_model.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {
namespace {

using nn::Floats;
using nn::PackLinear;
using Linear = nn::PackedLinear;

}  // namespace

absl::StatusOr<std::unique_ptr<CpuDecoder>> CpuDecoder::Create(const PixelModel& model,
                                                               const CpuStepTuning& tuning,
                                                               Precision precision) {
  const PixelModelConfig& c = model.config();
  std::unique_ptr<CpuDecoder> dec(new CpuDecoder());
  dec->tuning_ = tuning;
  dec->config_ = c;
  precision = nn::EffectivePrecision(precision, &dec->fallback_);
  dec->precision_ = precision;
  const bool bf16 = precision == Precision::kBf16;
  // A scored image's positions: N with a start token, else N - 1 (BitsPerDim).
  const int64_t image_rows = c.start_token ? c.seq_len() : c.seq_len() - 1;
  auto bf16_of = [&](const std::vector<std::string>& names, nn::Bf16Linear* step,
                     nn::Bf16Linear* image) -> absl::Status {
    if (!bf16) return absl::OkStatus();
    auto l = nn::Bf16LinearOf(model.parameters(), names, kBf16DecodeRows);
    if (!l.ok()) return l.status();
    *step = std::move(*l);
    l = nn::Bf16LinearOf(model.parameters(), names, image_rows);
    if (!l.ok()) return l.status();
    *image = std::move(*l);
    return absl::OkStatus();
  };
  try {
    at::NoGradGuard no_grad;
    const ParameterStore& p = model.parameters();
    // Each Krause layer's 1/sigma^2, validated as every decode step validates a log_sigma.
    ASSIGN_OR_RETURN(const std::vector<DecodeScale> scales, model.DecodeScales());
    const bool krause = c.attention == AttentionKind::kKrause;
    dec->kind_ = c.attention;
    dec->start_token_ = c.start_token;
    dec->d_ = c.d_model;
    dec->heads_ = c.heads;
    dec->head_dim_ = c.d_model / c.heads;
    dec->depth_ = c.depth;
    dec->mlp_ = c.mlp();
    dec->seq_len_ = c.seq_len();
    dec->cache_length_ = krause ? c.window : c.seq_len();
    dec->token_emb_ = Floats(p.Get("token_emb.weight"));
    dec->pos_emb_ = Floats(p.Get("pos_emb.weight"));
    if (c.start_token) dec->start_emb_ = Floats(p.Get("start_token"));
    if (c.conditional()) dec->class_emb_ = Floats(p.Get("class_emb.weight"));
    dec->class_norm_ = c.class_norm;
    // A LayerNorm's weight and bias, with class_norm one pair per class row, the class's scale
    // and shift folded in.
    auto norm = [&](const std::string& n, std::vector<float>* w, std::vector<float>* b) {
      *w = Floats(p.Get(n + ".weight"));
      *b = Floats(p.Get(n + ".bias"));
      if (!c.class_norm) return;
      const std::vector<float> scale = Floats(p.Get(n + ".class_scale"));
      const std::vector<float> shift = Floats(p.Get(n + ".class_shift"));
      const int64_t rows = c.classes + 1, d = c.d_model;
      std::vector<float> cw(rows * d), cb(rows * d);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < d; ++i) {
          const float g = scale[r * d + i] + 1.0f;
          cw[r * d + i] = (*w)[i] * g;
          cb[r * d + i] = (*b)[i] * g + shift[r * d + i];
        }
      }
      *w = std::move(cw);
      *b = std::move(cb);
    };
    double linear_macs = 0;
    for (int64_t l = 0; l < c.depth; ++l) {
      const std::string b = absl::StrCat("layers.", l, ".");
      const std::string a = b + "attn.";
      Layer layer;
      norm(b + "ln1", &layer.ln1_w, &layer.ln1_b);
      norm(b + "ln2", &layer.ln2_w, &layer.ln2_b);
      const std::vector<std::string> qkv =
          krause ? std::vector<std::string>{a + "W_q", a + "W_k", a + "W_v"}
                 : std::vector<std::string>{a + "q_proj", a + "k_proj", a + "v_proj"};
      layer.qkv = PackLinear(p, qkv);
      if (krause) layer.inv_var = Floats(scales[l].inv_var());
      layer.out = PackLinear(p, {a + "out_proj"});
      layer.mlp0 = PackLinear(p, {b + "mlp.0"});
      layer.mlp2 = PackLinear(p, {b + "mlp.2"});
      RETURN_IF_ERROR(bf16_of(qkv, &layer.qkv16, &layer.qkv16_image));
      RETURN_IF_ERROR(bf16_of({a + "out_proj"}, &layer.out16, &layer.out16_image));
      RETURN_IF_ERROR(bf16_of({b + "mlp.0"}, &layer.mlp016, &layer.mlp016_image));
      RETURN_IF_ERROR(bf16_of({b + "mlp.2"}, &layer.mlp216, &layer.mlp216_image));
      for (const Linear* lin : {&layer.qkv, &layer.out, &layer.mlp0, &layer.mlp2}) {
        linear_macs += static_cast<double>(lin->in * lin->out);
        dec->weight_bytes_ += lin->bytes();
      }
      dec->layers_.push_back(std::move(layer));
    }
    norm("ln_f", &dec->lnf_w_, &dec->lnf_b_);
    dec->head_ = PackLinear(p, {"head"});
    RETURN_IF_ERROR(bf16_of({"head"}, &dec->head16_, &dec->head16_image_));
    if (dec->head_.out != 256 || dec->head_.out_pad != 256) {
      return absl::InvalidArgumentError("head must have 256 outputs");
    }
    linear_macs += static_cast<double>(dec->head_.in * dec->head_.out);
    dec->weight_bytes_ += dec->head_.bytes();
    // Attention per head: scores and aggregation over the window (KARM) or, on average, half
    // the sequence (ARM).
    const double keys = krause ? static_cast<double>(c.window) : c.seq_len() / 2.0;
    dec->flops_per_sequence_ =
        2 * linear_macs + c.depth * c.heads * keys * 4.0 * static_cast<double>(dec->head_dim_);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot pack the decode weights: ", ExceptionMessage(e)));
  }
  return dec;
}

PixelDecodeWeights PackForDecode(const PixelModel& model, Precision precision) {
  PixelDecodeWeights w;
  absl::StatusOr<std::vector<DecodeScale>> scales = model.DecodeScales();
  TORCH_CHECK(scales.ok(), scales.status().ToString());
  w.scales = std::move(scales).value();
  if (model.device().is_cpu()) {
    auto cpu = CpuDecoder::Create(model, {}, precision);
    TORCH_CHECK(cpu.ok(), cpu.status().ToString());
    w.cpu = std::move(cpu).value();
  }
  return w;
}

}  // namespace krause
