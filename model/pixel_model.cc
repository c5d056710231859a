#include "model/pixel_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "model/attention/causal_softmax.h"
#include "model/kv_cache.h"
#include "model/nn/layers.h"
#include "model/util/status_macros.h"

namespace krause {

absl::StatusOr<PixelModel> PixelModel::Create(const PixelModelConfig& config, uint64_t seed) {
  RETURN_IF_ERROR(config.Validate());
  PixelModel m;
  m.config_ = config;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  ParameterStore& p = m.params_;
  const int64_t d = config.d_model;
  p.Add("token_emb.weight", nn::TruncNormal({256, d}, 0.02, gen));
  p.Add("pos_emb.weight", nn::TruncNormal({config.seq_len(), d}, 0.02, gen));
  if (config.start_token) p.Add("start_token", nn::TruncNormal({d}, 0.02, gen));
  const bool krause = config.attention == AttentionKind::kKrause;
  for (int64_t l = 0; l < config.depth; ++l) {
    const std::string b = absl::StrCat("layers.", l, ".");
    nn::AddLayerNorm(&p, b + "ln1", d);
    for (const char* proj : {"q", "k", "v"}) {
      const std::string name = krause ? absl::StrCat("W_", proj) : absl::StrCat(proj, "_proj");
      nn::AddLinear(&p, b + "attn." + name, d, d, gen);
    }
    nn::AddLinear(&p, b + "attn.out_proj", d, d, gen);
    if (krause) {
      p.Add(b + "attn.log_sigma", at::full({config.heads, 1, 1}, std::log(config.sigma_init)));
    }
    nn::AddLayerNorm(&p, b + "ln2", d);
    nn::AddLinear(&p, b + "mlp.0", d, config.mlp(), gen);
    nn::AddLinear(&p, b + "mlp.2", config.mlp(), d, gen);
  }
  nn::AddLayerNorm(&p, "ln_f", d);
  nn::AddLinear(&p, "head", d, 256, gen);
  // Last, so that the other parameters draw what an unconditional model of this size draws.
  if (config.classes > 0)
    p.Add("class_emb.weight", nn::TruncNormal({config.classes + 1, d}, 0.02, gen));
  // Per-class LayerNorm scale and shift, zero: the model starts as the one without them.
  if (config.class_norm) {
    std::vector<std::string> norms;
    for (int64_t l = 0; l < config.depth; ++l) {
      norms.push_back(absl::StrCat("layers.", l, ".ln1"));
      norms.push_back(absl::StrCat("layers.", l, ".ln2"));
    }
    norms.push_back("ln_f");
    for (const std::string& n : norms) {
      p.Add(n + ".class_scale", at::zeros({config.classes + 1, d}));
      p.Add(n + ".class_shift", at::zeros({config.classes + 1, d}));
    }
  }
  return m;
}

at::Tensor PixelModel::Attention(int64_t layer, const at::Tensor& x, KrauseImpl impl,
                                 std::vector<std::pair<at::Tensor, at::Tensor>>* kv,
                                 AttentionTrace* trace) const {
  // x: [B, T, D] -> [B, T, D]
  const std::string a = absl::StrCat("layers.", layer, ".attn.");
  const bool krause = config_.attention == AttentionKind::kKrause;
  const at::Tensor q =
      nn::SplitHeads(nn::Linear(params_, a + (krause ? "W_q" : "q_proj"), x), config_.heads);
  const at::Tensor k =
      nn::SplitHeads(nn::Linear(params_, a + (krause ? "W_k" : "k_proj"), x), config_.heads);
  const at::Tensor v =
      nn::SplitHeads(nn::Linear(params_, a + (krause ? "W_v" : "v_proj"), x), config_.heads);
  if (kv != nullptr) kv->push_back({k.detach(), v.detach()});
  AttentionTrace::Layer* const record = AttentionTrace::Begin(trace, layer, q, k, v);
  at::Tensor out;
  if (!krause) {
    auto r = CausalSoftmaxAttention(q, k, v, impl);
    TORCH_CHECK(r.ok(), r.status().ToString());
    out = *r;
    if (record != nullptr) {
      // The probabilities in the reference form: scores q.k / sqrt(d), the causal mask, softmax.
      const int64_t t = q.size(2);
      const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
      const at::Tensor future =
          at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
      record->probs = at::softmax(
          (at::matmul(q, k.transpose(-1, -2)) * scale).masked_fill(future, -INFINITY), -1);
    }
  } else {
    KrauseOptions o;
    o.neighbourhood = Neighbourhood::Causal(config_.window);
    o.top_k = config_.top_k;
    o.impl = impl;
    o.return_selection = record != nullptr;
    const at::Tensor& log_sigma = params_.Get(a + "log_sigma");
    auto r = KrauseAttention(q, k, v, log_sigma, o);
    TORCH_CHECK(r.ok(), r.status().ToString());
    out = r->out;
    if (record != nullptr)
      AttentionTrace::RecordSelection(record, *r, log_sigma, config_.heads, o.top_k);
  }
  return nn::Linear(params_, a + "out_proj", nn::MergeHeads(out));
}

at::Tensor PixelModel::Embed(const at::Tensor& u) const {
  const at::Tensor emb = at::embedding(params_.Get("token_emb.weight"), u.clamp_max(255));
  if (!config_.start_token) return emb;
  return at::where((u == kStartToken).unsqueeze(-1), params_.Get("start_token"), emb);
}

at::Tensor PixelModel::ClassRows(const at::Tensor& classes, int64_t b) const {
  if (!config_.conditional()) {
    TORCH_CHECK(!classes.defined(), "classes given to an unconditional model");
    return {};
  }
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device());
  at::Tensor c = classes.defined() ? classes.to(device(), at::kLong)
                                   : at::full({b}, config_.null_class(), opts);
  TORCH_CHECK(c.dim() == 1 && c.size(0) == b, "classes must have shape [", b, "]");
  return c;
}

at::Tensor PixelModel::Norm(const std::string& name, const at::Tensor& x,
                            const at::Tensor& rows) const {
  const at::Tensor h = nn::LayerNorm(params_, name, x);
  if (!config_.class_norm) return h;
  at::Tensor scale = params_.Get(name + ".class_scale").index_select(0, rows);  // [B, D]
  at::Tensor shift = params_.Get(name + ".class_shift").index_select(0, rows);
  if (x.dim() == 3) {
    scale = scale.unsqueeze(1);
    shift = shift.unsqueeze(1);
  }
  return h * (scale + 1) + shift;
}

at::Tensor PixelModel::ForwardTokens(const at::Tensor& u, KrauseImpl impl,
                                     std::vector<std::pair<at::Tensor, at::Tensor>>* kv,
                                     const at::Tensor& classes, AttentionTrace* trace) const {
  const int64_t t = u.size(1);
  const at::Tensor rows = ClassRows(classes, u.size(0));
  at::Tensor x = Embed(u) + params_.Get("pos_emb.weight").narrow(0, 0, t);  // [B, T, D]
  if (rows.defined()) x = x + at::embedding(params_.Get("class_emb.weight"), rows).unsqueeze(1);
  for (int64_t l = 0; l < config_.depth; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    x = x + Attention(l, Norm(p + "ln1", x, rows), impl, kv, trace);
    const at::Tensor h = Norm(p + "ln2", x, rows);
    x = x + nn::Linear(params_, p + "mlp.2", nn::Gelu(nn::Linear(params_, p + "mlp.0", h)));
  }
  return nn::Linear(params_, "head", Norm("ln_f", x, rows));
}

at::Tensor PixelModel::Forward(const at::Tensor& pixels, KrauseImpl impl,
                               const at::Tensor& classes) const {
  if (!config_.start_token) return ForwardTokens(pixels, impl, nullptr, classes);
  const at::Tensor start = at::full({pixels.size(0), 1}, kStartToken, pixels.options());
  return ForwardTokens(at::cat({start, pixels}, 1), impl, nullptr, classes);
}

at::Tensor PixelModel::Prefill(const at::Tensor& u, int64_t slot, PixelKvCache* cache,
                               KrauseImpl impl, const PixelDecodeWeights* packed) const {
  at::NoGradGuard no_grad;
  if (packed != nullptr && packed->cpu != nullptr &&
      (impl == KrauseImpl::kAuto || impl == KrauseImpl::kFusedCpu)) {
    TORCH_CHECK(u.dim() == 1 && u.device().is_cpu(), "u must be a CPU tensor of shape [T]");
    const at::Tensor uc = u.to(at::kLong).contiguous();
    at::Tensor logits = at::empty({uc.numel(), 256}, at::kFloat);
    const absl::Status st = packed->cpu->Prefill(uc.data_ptr<int64_t>(), uc.numel(), slot, cache,
                                                 logits.data_ptr<float>());
    TORCH_CHECK(st.ok(), st.ToString());
    return logits;
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> kv;
  at::Tensor classes;
  if (config_.conditional()) classes = at::full({1}, cache->slot_class(slot), at::kLong);
  const at::Tensor logits = ForwardTokens(u.to(device()).view({1, -1}), impl, &kv, classes);
  for (int64_t l = 0; l < config_.depth; ++l) {
    cache->layer(l).WritePrefix(slot, kv[l].first[0], kv[l].second[0]);
  }
  return logits[0];
}

at::Device PixelModel::device() const { return params_.Get("head.weight").device(); }

absl::StatusOr<std::vector<DecodeScale>> PixelModel::DecodeScales() const {
  std::vector<DecodeScale> scales;
  if (config_.attention != AttentionKind::kKrause) return scales;
  for (int64_t l = 0; l < config_.depth; ++l) {
    auto scale = DecodeScale::Create(params_.Get(absl::StrCat("layers.", l, ".attn.log_sigma")),
                                     config_.heads, device());
    if (!scale.ok()) {
      return absl::Status(scale.status().code(),
                          absl::StrCat("layer ", l, ": ", scale.status().message()));
    }
    scales.push_back(std::move(scale).value());
  }
  return scales;
}

at::Tensor PixelModel::DecodeStep(const at::Tensor& u, const at::Tensor& positions,
                                  const at::Tensor& slots, PixelKvCache* cache,
                                  const PixelDecodeWeights* packed) const {
  if (packed != nullptr && packed->cpu != nullptr) {
    const int64_t s = slots.numel();
    TORCH_CHECK(u.dim() == 1 && positions.dim() == 1 && slots.dim() == 1 && u.numel() == s &&
                    positions.numel() == s && u.device().is_cpu() && positions.device().is_cpu() &&
                    slots.device().is_cpu(),
                "u, positions and slots must be CPU tensors of shape [S]");
    const at::Tensor uc = u.to(at::kLong).contiguous(), pc = positions.to(at::kLong).contiguous(),
                     sc = slots.to(at::kLong).contiguous();
    at::Tensor logits = at::empty({s, 256}, at::kFloat);
    const absl::Status st =
        packed->cpu->Step(uc.data_ptr<int64_t>(), pc.data_ptr<int64_t>(), sc.data_ptr<int64_t>(), s,
                          cache, logits.data_ptr<float>());
    TORCH_CHECK(st.ok(), st.ToString());
    return logits;
  }
  // u, positions and slots live on the host; the model's device gets copies (asynchronous
  // from pinned buffers), made once for every layer.
  auto index = DecodeIndex::Create(slots, positions, cache->slots(), device());
  TORCH_CHECK(index.ok(), index.status().ToString());
  return DecodeStep(u.to(device(), /*non_blocking=*/true), *index, cache, packed);
}

at::Tensor PixelModel::DecodeStep(const at::Tensor& u_device, const DecodeIndex& index,
                                  PixelKvCache* cache, const PixelDecodeWeights* packed) const {
  at::NoGradGuard no_grad;
  const int64_t s = index.size(), h = config_.heads, dh = config_.d_model / h;
  const bool krause = config_.attention == AttentionKind::kKrause;
  const at::Device dev = device();
  TORCH_CHECK(u_device.dim() == 1 && u_device.size(0) == s && u_device.device() == dev,
              "u must have shape [S] = [", s, "] on ", dev.str());
  if (packed != nullptr && packed->cpu != nullptr) {
    const at::Tensor uc = u_device.to(at::kLong).contiguous();
    at::Tensor logits = at::empty({s, 256}, at::kFloat);
    const absl::Status st = packed->cpu->Step(
        uc.data_ptr<int64_t>(), index.host_positions().data_ptr<int64_t>(),
        index.host_slots().data_ptr<int64_t>(), s, cache, logits.data_ptr<float>());
    TORCH_CHECK(st.ok(), st.ToString());
    return logits;
  }
  // LibTorch ops: the reference of the packed CPU step, and the GPU path.
  TORCH_CHECK(cache->kind() == config_.attention && cache->layers() == config_.depth,
              "the cache was made for another model (kind or depth differ)");
  const at::Tensor& pos_d = index.device_positions();
  at::Tensor x = Embed(u_device) + params_.Get("pos_emb.weight").index_select(0, pos_d);
  at::Tensor rows;  // each sequence's class row (conditional models)
  if (config_.conditional()) {
    // Each sequence's class, from the cache's per-slot classes on the device (no host read:
    // what a CUDA graph captures).
    rows = cache->slot_classes().index_select(0, index.device_slots());
    x = x + params_.Get("class_emb.weight").index_select(0, rows);
  }
  // The Krause layers' scales: validated once by PackForDecode, or here for this step.
  std::vector<DecodeScale> step_scales;
  const std::vector<DecodeScale>* scales = &step_scales;
  if (packed != nullptr && !packed->scales.empty()) {
    scales = &packed->scales;
  } else if (krause) {
    auto made = DecodeScales();
    TORCH_CHECK(made.ok(), made.status().ToString());
    step_scales = std::move(made).value();
  }
  for (int64_t l = 0; l < config_.depth; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    const std::string a = p + "attn.";
    const at::Tensor hn = Norm(p + "ln1", x, rows);
    const at::Tensor q = nn::Linear(params_, a + (krause ? "W_q" : "q_proj"), hn).view({s, h, dh});
    const at::Tensor k = nn::Linear(params_, a + (krause ? "W_k" : "k_proj"), hn).view({s, h, dh});
    const at::Tensor v = nn::Linear(params_, a + (krause ? "W_v" : "v_proj"), hn).view({s, h, dh});
    auto attended = cache->layer(l).Attend(q, k, v, index, krause ? &(*scales)[l] : nullptr);
    TORCH_CHECK(attended.ok(), "layer ", l, ": ", attended.status().ToString());
    const at::Tensor& out = *attended;
    x = x + nn::Linear(params_, a + "out_proj", out.reshape({s, config_.d_model}));
    const at::Tensor hm = Norm(p + "ln2", x, rows);
    x = x + nn::Linear(params_, p + "mlp.2", nn::Gelu(nn::Linear(params_, p + "mlp.0", hm)));
  }
  return nn::Linear(params_, "head", Norm("ln_f", x, rows));
}

at::Tensor PixelModel::NllPerImage(const at::Tensor& images, KrauseImpl impl,
                                   const at::Tensor& classes) const {
  // images: [B, N] int64
  const int64_t n = images.size(1);
  // With a start token the N positions predict x_0..x_{N-1}; without one, the N - 1 positions
  // predict x_1..x_{N-1}.
  const at::Tensor logits = Forward(images.narrow(1, 0, n - 1), impl, classes);
  const at::Tensor targets = config_.start_token ? images : images.narrow(1, 1, n - 1);
  const at::Tensor logp = at::log_softmax(logits, -1);
  return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).mean(1);
}

AttentionCost PixelModel::FlopsPerImage() const {
  const int64_t n = config_.seq_len(), d = config_.d_model, dh = d / config_.heads;
  const double per_token = 2.0 * d * 3 * d + 2.0 * d * d + 2.0 * d * config_.mlp() * 2;
  AttentionCost total;
  for (int64_t l = 0; l < config_.depth; ++l) {
    AttentionCost a;
    if (config_.attention == AttentionKind::kKrause) {
      a = KrauseAttentionCost(Neighbourhood::Causal(config_.window), n, config_.top_k,
                              config_.heads, dh);
    } else {
      a = KrauseAttentionCost(Neighbourhood::Causal(n), n, n, config_.heads, dh);
      a.executed_flops = a.dense_equivalent_flops;  // softmax: no key biases, no selection
      a.selection_comparisons = 0;
    }
    total.executed_flops += a.executed_flops + n * per_token;
    total.dense_equivalent_flops += a.dense_equivalent_flops + n * per_token;
    total.selection_comparisons += a.selection_comparisons;
  }
  const double head = 2.0 * n * d * 256;
  total.executed_flops += head;
  total.dense_equivalent_flops += head;
  return total;
}

}  // namespace krause
