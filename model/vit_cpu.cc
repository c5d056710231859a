#include "model/vit_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "model/attention/decode.h"
#include "model/util/tensor_checks.h"
#include "model/util/threads.h"

namespace krause {

using nn::Floats;
using nn::LayerNormRow;
using nn::PackLinear;

absl::StatusOr<std::unique_ptr<CpuViT>> CpuViT::Create(const ViT& model, Precision precision) {
  const ViTConfig& c = model.config();
  std::unique_ptr<CpuViT> v(new CpuViT());
  precision = nn::EffectivePrecision(precision, &v->fallback_);
  v->precision_ = precision;
  try {
    at::NoGradGuard no_grad;
    const ParameterStore& p = model.parameters();
    v->krause_ = c.attention == AttentionKind::kKrause;
    v->cls_ = c.cls;
    v->channels_ = c.channels;
    v->size_ = c.image_size;
    v->patch_ = c.patch;
    v->grid_ = c.grid();
    v->tokens_ = c.tokens();
    v->d_ = c.d_model;
    v->heads_ = c.heads;
    v->head_dim_ = c.d_model / c.heads;
    v->mlp_ = c.mlp;
    v->classes_ = c.classes;
    for (double m : c.mean) v->mean_.push_back(static_cast<float>(m));
    for (double s : c.std) v->std_.push_back(static_cast<float>(s));
    v->softmax_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(v->head_dim_)));
    v->patch_embed_ =
        PackLinear({p.Get("patch_embed.proj.weight")}, {p.Get("patch_embed.proj.bias")});
    if (c.cls) v->cls_token_ = Floats(p.Get("cls_token"));
    v->pos_embed_ = Floats(p.Get("pos_embed"));
    const std::vector<int64_t> ks = c.TopKSchedule();
    for (int64_t l = 0; l < c.depth; ++l) {
      const std::string b = absl::StrCat("blocks.", l, ".");
      const std::string a = b + "attention.";
      Layer layer;
      if (precision == Precision::kBf16) {
        const int64_t n = c.tokens();
        for (auto [dst, names] :
             {std::pair{&layer.qkv16, std::vector<std::string>{a + "W_q", a + "W_k", a + "W_v"}},
              std::pair{&layer.out16, std::vector<std::string>{a + "out_proj"}},
              std::pair{&layer.mlp016, std::vector<std::string>{b + "ffn.0"}},
              std::pair{&layer.mlp216, std::vector<std::string>{b + "ffn.3"}}}) {
          auto l16 = nn::Bf16LinearOf(p, names, n);
          if (!l16.ok()) return l16.status();
          *dst = std::move(*l16);
        }
      } else {
        layer.qkv = PackLinear(p, {a + "W_q", a + "W_k", a + "W_v"});
        layer.out = PackLinear(p, {a + "out_proj"});
        layer.mlp0 = PackLinear(p, {b + "ffn.0"});
        layer.mlp2 = PackLinear(p, {b + "ffn.3"});
      }
      layer.norm1_w = Floats(p.Get(b + "norm1.weight"));
      layer.norm1_b = Floats(p.Get(b + "norm1.bias"));
      layer.norm2_w = Floats(p.Get(b + "norm2.weight"));
      layer.norm2_b = Floats(p.Get(b + "norm2.bias"));
      if (v->krause_) {
        // Validated as the attention operator validates a log_sigma.
        auto scale = DecodeScale::Create(p.Get(a + "log_sigma"), c.heads, at::Device(at::kCPU));
        if (!scale.ok()) {
          return absl::Status(scale.status().code(),
                              absl::StrCat("layer ", l, ": ", scale.status().message()));
        }
        layer.inv_var = Floats(scale->inv_var())[0];
        layer.top_k = ks[l];
      }
      v->layers_.push_back(std::move(layer));
    }
    v->norm_w_ = Floats(p.Get("norm.weight"));
    v->norm_b_ = Floats(p.Get("norm.bias"));
    v->head_ = PackLinear(p, {"head"});
    if (v->krause_) {
      const Neighbourhood nb = Neighbourhood::Grid(c.grid(), c.grid(), c.radius, c.metric, c.cls);
      const absl::Status st = ValidateNeighbourhood(nb, c.tokens());
      if (!st.ok()) return st;
      v->table_ = CachedCandidateTable(nb, c.tokens());
    }
    v->flops_per_image_ = model.FlopsPerImage().executed_flops;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot pack the classifier: ", ExceptionMessage(e)));
  }
  return v;
}

int64_t CpuViT::weight_bytes() const {
  int64_t bytes = patch_embed_.bytes() + head_.bytes();
  for (const Layer& l : layers_) {
    bytes += l.qkv.bytes() + l.out.bytes() + l.mlp0.bytes() + l.mlp2.bytes();
    if (precision_ == Precision::kBf16)
      bytes += l.qkv16.bytes() + l.out16.bytes() + l.mlp016.bytes() + l.mlp216.bytes();
  }
  return bytes;
}

std::string CpuViT::linear_kernels() const { return nn::LinearKernelsName(precision_); }

namespace {

// f(begin, end) over [0, n): on the calling thread, or split over the intra-op threads (tasks of
// at least `grain`) when `parallel`. What each index computes does not depend on the split.
template <typename F>
void Over(bool parallel, int64_t n, int64_t grain, const F& f) {
  if (parallel) {
    at::parallel_for(0, n, grain, f);
  } else {
    f(0, n);
  }
}

// out = x W^T + b, the output chunks split over the threads when `parallel`.
void PackedApply(const nn::PackedLinear& l, const float* x, int64_t rows, float* out,
                 bool parallel) {
  Over(parallel, l.chunks(), 1, [&](int64_t c0, int64_t c1) { l.Apply(x, rows, out, c0, c1); });
}

}  // namespace

void CpuViT::Image(const uint8_t* pixels, float* probs, bool parallel) const {
  const int64_t n = tokens_, d = d_, dh = head_dim_, g2 = grid_ * grid_;
  const int64_t cpp = channels_ * patch_ * patch_;
  const int64_t kt_stride = cpu::RoundUpToChunk(n);
  const int64_t qkv_pad = cpu::RoundUpToChunk(3 * d), d_pad = cpu::RoundUpToChunk(d);
  const int64_t mlp_pad = cpu::RoundUpToChunk(mlp_);
  nn::ThreadScratch& scratch = nn::ThreadScratch::Get();
  // Row buffers of one image (the calling thread's; with `parallel` the other threads write
  // disjoint parts of them and use their own scratch for the kernels).
  // Per head: q, k, v, out [N, dh], key biases or logsumexps [N], keys transposed [dh, N pad].
  const int64_t per_head = 4 * n * dh + n + dh * kt_stride;
  float* base = scratch.Rows(g2 * cpp + n * d + n * qkv_pad + heads_ * per_head + n * d +
                             n * std::max(d_pad, head_.out_pad) + n * mlp_pad + n * mlp_);
  float* patches = base;                   // [G*G, C*p*p]
  float* x = patches + g2 * cpp;           // [N, D]
  float* qkv = x + n * d;                  // [N, 3D pad]
  float* heads = qkv + n * qkv_pad;        // per head: q, k, v, out [N, dh], bias [N], kt
  float* att = heads + heads_ * per_head;  // [N, D]
  float* tmp = att + n * d;                // [N, D pad]
  float* mid = tmp + n * std::max(d_pad, head_.out_pad);  // [N, MLP pad]
  float* act = mid + n * mlp_pad;                         // [N, MLP]
  // bf16: a layer's input rounded (the widest input, the MLP's).
  uint16_t* halves =
      precision_ == Precision::kBf16 ? scratch.Halves(n * std::max(d, mlp_)) : nullptr;

  // Normalised pixels, gathered patch by patch in the convolution weight's order (c, y, x).
  const int64_t hw = size_ * size_;
  for (int64_t gr = 0; gr < grid_; ++gr) {
    for (int64_t gc = 0; gc < grid_; ++gc) {
      float* row = patches + (gr * grid_ + gc) * cpp;
      for (int64_t c = 0; c < channels_; ++c) {
        for (int64_t py = 0; py < patch_; ++py) {
          const uint8_t* src = pixels + c * hw + (gr * patch_ + py) * size_ + gc * patch_;
          for (int64_t px = 0; px < patch_; ++px) {
            float v = static_cast<float>(src[px]) / 255.0f;
            if (!mean_.empty()) v = (v - mean_[c]) / std_[c];
            row[(c * patch_ + py) * patch_ + px] = v;
          }
        }
      }
    }
  }
  PackedApply(patch_embed_, patches, g2, tmp, parallel);
  const int64_t first = cls_ ? 1 : 0;
  if (cls_) {
    for (int64_t i = 0; i < d; ++i) x[i] = cls_token_[i] + pos_embed_[i];
  }
  for (int64_t t = 0; t < g2; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      x[(first + t) * d + i] = tmp[t * d_pad + i] + pos_embed_[(first + t) * d + i];
    }
  }

  const cpu::CpuKernelTable& kernels = cpu::CpuKernels();
  // The row-wise steps (linear layers, residuals, norms, GELU) run in blocks of rows: with bf16
  // the GEMMs' own fixed blocks (nn::Bf16Linear: what keeps a row's bits independent of the
  // split), with fp32 one block per thread (any split gives the packed kernel's bits). Each
  // parallel region does as much as its rows allow before the next needs other rows: a layer is
  // one region over its heads and one over its rows (out projection to the next layer's q/k/v),
  // since every region wakes the other threads (OpenMP's, which sleep at once when the process
  // has more OpenMP threads than cores, as a server does).
  const bool bf16 = precision_ == Precision::kBf16;
  const int64_t threads = parallel ? std::max<int64_t>(1, at::get_num_threads()) : 1;
  const int64_t block_rows = bf16 ? layers_[0].qkv16.block_rows() : (n + threads - 1) / threads;
  const int64_t blocks = (n + block_rows - 1) / block_rows;
  // out rows [r0, r1) = x rows W^T + b for the rows of blocks [b0, b1).
  auto linear = [&](const nn::PackedLinear& f32, const nn::Bf16Linear& b16, const float* in,
                    int64_t in_width, float* out, int64_t out_stride, int64_t b0, int64_t b1) {
    const int64_t r0 = b0 * block_rows, r1 = std::min(n, b1 * block_rows);
    if (bf16) {
      nn::ToBf16(in + r0 * in_width, (r1 - r0) * in_width, halves + r0 * in_width);
      b16.Apply(halves, out, b0, b1);
    } else {
      f32.Apply(in + r0 * in_width, r1 - r0, out + r0 * out_stride);
    }
  };
  auto qkv_rows = [&](const Layer& L, int64_t b0, int64_t b1) {
    linear(L.qkv, L.qkv16, x, d, qkv, qkv_pad, b0, b1);
  };
  // Post-LN blocks: x = norm1(x + attn(x)); x = norm2(x + ffn(x)), rows of blocks [b0, b1).
  auto rows_after_attention = [&](const Layer& L, int64_t b0, int64_t b1) {
    const int64_t r0 = b0 * block_rows, r1 = std::min(n, b1 * block_rows);
    linear(L.out, L.out16, att, d, tmp, d_pad, b0, b1);
    for (int64_t t = r0; t < r1; ++t) {
      float* xr = x + t * d;
      for (int64_t i = 0; i < d; ++i) xr[i] += tmp[t * d_pad + i];
      LayerNormRow(xr, d, L.norm1_w.data(), L.norm1_b.data(), xr);
    }
    linear(L.mlp0, L.mlp016, x, d, mid, mlp_pad, b0, b1);
    for (int64_t t = r0; t < r1; ++t) nn::GeluRow(mid + t * mlp_pad, mlp_, act + t * mlp_);
    linear(L.mlp2, L.mlp216, act, mlp_, tmp, d_pad, b0, b1);
    for (int64_t t = r0; t < r1; ++t) {
      float* xr = x + t * d;
      for (int64_t i = 0; i < d; ++i) xr[i] += tmp[t * d_pad + i];
      LayerNormRow(xr, d, L.norm2_w.data(), L.norm2_b.data(), xr);
    }
  };
  Over(parallel, blocks, 1, [&](int64_t b0, int64_t b1) { qkv_rows(layers_[0], b0, b1); });
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    Over(parallel, heads_, 1, [&](int64_t h0, int64_t h1) {
      nn::ThreadScratch& own = nn::ThreadScratch::Get();
      for (int64_t hh = h0; hh < h1; ++hh) {
        float* q = heads + hh * per_head;
        float* k = q + n * dh;
        float* v = k + n * dh;
        float* o = v + n * dh;
        float* bias = o + n * dh;
        float* kt = bias + n;
        for (int64_t t = 0; t < n; ++t) {
          const float* row = qkv + t * qkv_pad + hh * dh;
          std::copy(row, row + dh, q + t * dh);
          std::copy(row + d, row + d + dh, k + t * dh);
          std::copy(row + 2 * d, row + 2 * d + dh, v + t * dh);
        }
        if (krause_) {
          kernels.key_biases(k, n, dh, bias);
          cpu::PrefillSlice s{};
          s.q = q;
          s.k = k;
          s.kt = nullptr;  // a table's rows read k directly
          s.bias = bias;
          s.v = v;
          s.inv_var = L.inv_var;
          s.n = n;
          s.d = dh;
          s.top_k = L.top_k;
          s.kind = 2;
          s.table = table_->index.data();
          s.table_count = table_->count.data();
          s.table_width = table_->width;
          s.out = o;
          kernels.prefill(s, 0, n, own.Kernel(table_->width));
        } else {
          // Dense softmax attention through the softmax kernel (not causal): the scores of a
          // group of queries against the transposed keys, the row softmax, the weighted values.
          for (int64_t e = 0; e < dh; ++e) {
            float* col = kt + e * kt_stride;
            for (int64_t t = 0; t < n; ++t) col[t] = k[t * dh + e];
            std::fill(col + n, col + kt_stride, 0.0f);
          }
          cpu::SoftmaxSlice s{};
          s.q = q;
          s.k = k;
          s.kt = kt;
          s.v = v;
          s.scale = softmax_scale_;
          s.n = n;
          s.d = dh;
          s.stride = kt_stride;
          s.out = o;
          s.lse = bias;
          s.causal = false;
          kernels.softmax_forward(s, 0, n, own.Floats(cpu::SoftmaxScratchFloats(n)));
        }
        for (int64_t t = 0; t < n; ++t)
          std::copy(o + t * dh, o + (t + 1) * dh, att + t * d + hh * dh);
      }
    });
    Over(parallel, blocks, 1, [&](int64_t b0, int64_t b1) {
      rows_after_attention(L, b0, b1);
      if (l + 1 < layers_.size()) qkv_rows(layers_[l + 1], b0, b1);
    });
  }
  // The final norm and the head on CLS (or on the mean of the normed patch tokens).
  float* pooled = att;
  if (cls_) {
    LayerNormRow(x, d, norm_w_.data(), norm_b_.data(), pooled);
  } else {
    std::fill(pooled, pooled + d, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      LayerNormRow(x + t * d, d, norm_w_.data(), norm_b_.data(), x + t * d);
      for (int64_t i = 0; i < d; ++i) pooled[i] += x[t * d + i];
    }
    for (int64_t i = 0; i < d; ++i) pooled[i] /= static_cast<float>(n);
  }
  head_.Apply(pooled, 1, tmp);
  nn::SoftmaxRow(tmp, classes_, probs);
}

absl::Status CpuViT::Forward(const uint8_t* pixels, int64_t images, float* probs, Split split,
                             const std::function<void(int64_t image)>& before_image) const {
  if (images < 0)
    return absl::InvalidArgumentError(absl::StrCat("images must be >= 0, got ", images));
  const int64_t image_bytes = channels_ * size_ * size_;
  try {
    if (split == Split::kAuto) {
      split = images < at::get_num_threads() && flops_per_image_ >= 2 * kMinParallelForwardFlops
                  ? Split::kWithinImage
                  : Split::kImages;
    }
    if (split == Split::kWithinImage) {
      // Fewer images than threads, each worth splitting: one image at a time on all threads
      // (its layers' output columns, heads and rows split between them).
      for (int64_t i = 0; i < images; ++i)
        Image(pixels + i * image_bytes, probs + i * classes_, /*parallel=*/true);
    } else {
      // Whole images on as many threads as tasks of at least half the parallel threshold fill;
      // each thread takes the next image left, so a thread that the RPC threads slowed down
      // leaves the rest to the others instead of holding the batch up.
      const int64_t grain = GrainForWork(flops_per_image_, kMinParallelForwardFlops / 2);
      const int64_t tasks = std::min<int64_t>(at::get_num_threads(), (images + grain - 1) / grain);
      std::atomic<int64_t> next{0};
      const auto run = [&](int64_t, int64_t) {
        for (int64_t i = next.fetch_add(1); i < images; i = next.fetch_add(1)) {
          if (before_image) before_image(i);
          Image(pixels + i * image_bytes, probs + i * classes_, false);
        }
      };
      if (tasks <= 1) {
        run(0, 1);
      } else {
        at::parallel_for(0, tasks, 1, run);
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("classifier forward failed: ", ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

}  // namespace krause
