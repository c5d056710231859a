#include "model/vit.h"

#include <ATen/ATen.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "model/nn/layers.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {

std::vector<int64_t> ViTConfig::TopKSchedule() const {
  std::vector<int64_t> ks;
  for (int64_t l = 0; l < depth; ++l) {
    const double t = depth == 1 ? 0.0 : static_cast<double>(l) / (depth - 1);
    // round half to even, as torch.round / numpy.round
    ks.push_back(static_cast<int64_t>(std::nearbyint(top_k + t * top_k)));
  }
  return ks;
}

std::string ViTConfig::ToJson() const {
  nlohmann::json j = {{"model", "vit"},
                      {"attention", AttentionKindName(attention)},
                      {"image_size", image_size},
                      {"channels", channels},
                      {"patch", patch},
                      {"width", d_model},
                      {"depth", depth},
                      {"heads", heads},
                      {"mlp", mlp},
                      {"classes", classes},
                      {"radius", radius},
                      {"metric", metric == GridMetric::kManhattan ? "manhattan" : "chebyshev"},
                      {"top_k", top_k},
                      {"sigma_init", sigma_init},
                      {"cls", cls},
                      {"labels", labels},
                      {"mean", mean},
                      {"std", std}};
  return j.dump();
}

absl::StatusOr<ViTConfig> ViTConfig::FromJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError("config: not a JSON object");
  ViTConfig c;
  try {
    if (j.value("model", "vit") != "vit") {
      return absl::InvalidArgumentError("config: model is not \"vit\"");
    }
    absl::StatusOr<AttentionKind> kind =
        ParseAttentionKind(j.value("attention", std::string(AttentionKindName(c.attention))));
    if (!kind.ok()) return kind.status();
    c.attention = *kind;
    c.image_size = j.value("image_size", c.image_size);
    c.channels = j.value("channels", c.channels);
    c.patch = j.value("patch", c.patch);
    c.d_model = j.value("width", c.d_model);
    c.depth = j.value("depth", c.depth);
    c.heads = j.value("heads", c.heads);
    c.mlp = j.value("mlp", c.mlp);
    c.classes = j.value("classes", c.classes);
    c.radius = j.value("radius", c.radius);
    const std::string metric = j.value("metric", std::string("manhattan"));
    if (metric != "manhattan" && metric != "chebyshev") {
      return absl::InvalidArgumentError(
          absl::StrCat("config: metric \"", metric, "\" is not manhattan or chebyshev"));
    }
    c.metric = metric == "manhattan" ? GridMetric::kManhattan : GridMetric::kChebyshev;
    c.top_k = j.value("top_k", c.top_k);
    c.sigma_init = j.value("sigma_init", c.sigma_init);
    c.cls = j.value("cls", c.cls);
    c.labels = j.value("labels", c.labels);
    c.mean = j.value("mean", c.mean);
    c.std = j.value("std", c.std);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", ExceptionMessage(e)));
  }
  RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::Status ViTConfig::Validate() const {
  if (image_size < 1 || channels < 1 || patch < 1 || image_size % patch != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: image_size ", image_size, " must be a positive multiple of patch ", patch));
  }
  if (d_model < 1 || heads < 1 || d_model % heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: width (d_model) ", d_model, " must be a multiple of heads ", heads));
  }
  if (depth < 1 || mlp < 1 || classes < 1 || top_k < 1 || radius < 0 || !(sigma_init > 0)) {
    return absl::InvalidArgumentError(
        "config: depth, mlp, classes, top_k and sigma_init must be positive, radius >= 0");
  }
  if (mean.size() != std.size() ||
      (!mean.empty() && static_cast<int64_t>(mean.size()) != channels)) {
    return absl::InvalidArgumentError("config: mean and std need one value per channel");
  }
  if (!labels.empty() && static_cast<int64_t>(labels.size()) != classes) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: ", labels.size(), " labels for ", classes, " classes"));
  }
  return absl::OkStatus();
}

const std::set<std::string>& ViT::IgnoredCheckpointNames() {
  static const auto* names = [] {
    auto* s = new std::set<std::string>();
    for (int l = 0; l < 64; ++l) {
      for (const char* b : {"local_mask_buffer", "valid_i_indices", "valid_j_indices"}) {
        s->insert(absl::StrCat("blocks.", l, ".attention.", b));
      }
    }
    return s;
  }();
  return *names;
}

absl::StatusOr<ViT> ViT::Create(const ViTConfig& config, uint64_t seed) {
  RETURN_IF_ERROR(config.Validate());
  ViT m;
  m.config_ = config;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  ParameterStore& p = m.params_;
  const int64_t d = config.d_model, patch_area = config.channels * config.patch * config.patch;
  p.Add("patch_embed.proj.weight", nn::TruncNormal({d, config.channels, config.patch, config.patch},
                                                   1.0 / std::sqrt(patch_area), gen));
  p.Add("patch_embed.proj.bias", at::zeros({d}));
  if (config.cls) p.Add("cls_token", nn::TruncNormal({1, 1, d}, 0.02, gen));
  p.Add("pos_embed", nn::TruncNormal({1, config.tokens(), d}, 0.02, gen));
  for (int64_t l = 0; l < config.depth; ++l) {
    const std::string b = absl::StrCat("blocks.", l, ".");
    for (const char* proj : {"W_q", "W_k", "W_v", "out_proj"}) {
      nn::AddLinear(&p, b + "attention." + proj, d, d, gen);
    }
    if (config.attention == AttentionKind::kKrause) {
      p.Add(b + "attention.log_sigma", at::full({1}, std::log(config.sigma_init)));
    }
    nn::AddLayerNorm(&p, b + "norm1", d);
    nn::AddLayerNorm(&p, b + "norm2", d);
    nn::AddLinear(&p, b + "ffn.0", d, config.mlp, gen);
    nn::AddLinear(&p, b + "ffn.3", config.mlp, d, gen);
  }
  nn::AddLayerNorm(&p, "norm", d);
  nn::AddLinear(&p, "head", d, config.classes, gen);
  return m;
}

at::Tensor ViT::Attention(int64_t layer, const at::Tensor& x, KrauseImpl impl,
                          AttentionTrace* trace) const {
  // x: [B, N, D] -> [B, N, D]
  const std::string a = absl::StrCat("blocks.", layer, ".attention.");
  const at::Tensor q = nn::SplitHeads(nn::Linear(params_, a + "W_q", x), config_.heads);
  const at::Tensor k = nn::SplitHeads(nn::Linear(params_, a + "W_k", x), config_.heads);
  const at::Tensor v = nn::SplitHeads(nn::Linear(params_, a + "W_v", x), config_.heads);
  at::Tensor out;
  AttentionTrace::Layer* const record = AttentionTrace::Begin(trace, layer, q, k, v);
  if (config_.attention == AttentionKind::kSoftmax) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const at::Tensor probs = at::softmax(at::matmul(q, k.transpose(-1, -2)) * scale, -1);
    if (record != nullptr) record->probs = probs.detach();
    out = at::matmul(probs, v);
  } else {
    KrauseOptions o;
    o.neighbourhood = Neighbourhood::Grid(config_.grid(), config_.grid(), config_.radius,
                                          config_.metric, config_.cls);
    o.top_k = config_.TopKSchedule()[layer];
    o.impl = impl;
    o.return_selection = record != nullptr;
    const at::Tensor& log_sigma = params_.Get(a + "log_sigma");
    auto r = KrauseAttention(q, k, v, log_sigma, o);
    TORCH_CHECK(r.ok(), r.status().ToString());  // shapes are ours: a failure is a bug
    out = r->out;
    if (record != nullptr)
      AttentionTrace::RecordSelection(record, *r, log_sigma, config_.heads, o.top_k);
  }
  return nn::Linear(params_, a + "out_proj", nn::MergeHeads(out));
}

at::Tensor ViT::Forward(const at::Tensor& images, KrauseImpl impl, AttentionTrace* trace) const {
  return nn::Linear(params_, "head", Features(images, impl, trace));
}

at::Tensor ViT::Features(const at::Tensor& images, KrauseImpl impl, AttentionTrace* trace) const {
  const int64_t b = images.size(0);
  at::Tensor x = at::conv2d(images, params_.Get("patch_embed.proj.weight"),
                            params_.Get("patch_embed.proj.bias"), {config_.patch, config_.patch});
  x = x.flatten(2).transpose(1, 2);  // [B, G*G, D]
  if (config_.cls) x = at::cat({params_.Get("cls_token").expand({b, 1, config_.d_model}), x}, 1);
  x = x + params_.Get("pos_embed");
  for (int64_t l = 0; l < config_.depth; ++l) {
    const std::string p = absl::StrCat("blocks.", l, ".");
    x = nn::LayerNorm(params_, p + "norm1", x + Attention(l, x, impl, trace));
    const at::Tensor f =
        nn::Linear(params_, p + "ffn.3", nn::Gelu(nn::Linear(params_, p + "ffn.0", x)));
    x = nn::LayerNorm(params_, p + "norm2", x + f);
  }
  x = nn::LayerNorm(params_, "norm", x);
  return config_.cls ? x.select(1, 0) : x.mean(1);
}

AttentionCost ViT::FlopsPerImage() const {
  const int64_t n = config_.tokens(), d = config_.d_model, dh = d / config_.heads;
  const double per_token_dense = 2.0 * d * 3 * d + 2.0 * d * d + 2.0 * d * config_.mlp * 2;
  const double patch =
      2.0 * config_.grid() * config_.grid() * d * config_.channels * config_.patch * config_.patch;
  AttentionCost total;
  const Neighbourhood nb = Neighbourhood::Grid(config_.grid(), config_.grid(), config_.radius,
                                               config_.metric, config_.cls);
  const auto ks = config_.TopKSchedule();
  for (int64_t l = 0; l < config_.depth; ++l) {
    AttentionCost a;
    if (config_.attention == AttentionKind::kKrause) {
      a = KrauseAttentionCost(nb, n, ks[l], config_.heads, dh);
    } else {
      a.executed_flops = a.dense_equivalent_flops =
          n * DenseAttentionQueryFlops(n, config_.heads, dh);
    }
    total.executed_flops += a.executed_flops + n * per_token_dense;
    total.dense_equivalent_flops += a.dense_equivalent_flops + n * per_token_dense;
    total.selection_comparisons += a.selection_comparisons;
    total.candidates += a.candidates;
    total.kept += a.kept;
  }
  const double head = 2.0 * d * config_.classes;
  total.executed_flops += patch + head;
  total.dense_equivalent_flops += patch + head;
  return total;
}

at::Tensor NormalizePixels(const ViTConfig& c, const at::Tensor& pixels) {
  at::Tensor x = pixels.to(at::kFloat) / 255.0;
  if (c.mean.size() == 1) {
    // One channel: the same float arithmetic with scalars, without building two tensors per call.
    return x.sub_(static_cast<float>(c.mean[0])).div_(static_cast<float>(c.std[0]));
  }
  if (!c.mean.empty()) {
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(pixels.device());
    const at::Tensor mean = at::tensor(c.mean, at::kDouble).to(opts).view({1, -1, 1, 1});
    const at::Tensor std = at::tensor(c.std, at::kDouble).to(opts).view({1, -1, 1, 1});
    x = (x - mean) / std;
  }
  return x;
}

}  // namespace krause
