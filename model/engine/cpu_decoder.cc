#include "model/engine/cpu_decoder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "model/kv_cache.h"
#include "model/nn/packed.h"
#include "model/pixel_model.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"
#include "model/util/threads.h"

namespace krause {
namespace {

using nn::Floats;
using nn::GeluRow;
using nn::LayerNormRow;
using nn::ThreadScratch;
using Linear = nn::PackedLinear;

ThreadScratch& Scratch() { return ThreadScratch::Get(); }

int64_t Chunks(const Linear& l) { return l.chunks(); }

int64_t Bf16Blocks(int64_t rows) { return (rows + kBf16DecodeRows - 1) / kBf16DecodeRows; }

}  // namespace

CpuStepPlan PlanCpuStep(const CpuStepShape& shape, const CpuStepTuning& tuning) {
  CpuStepPlan plan;
  const double total = static_cast<double>(shape.sequences) * shape.flops_per_sequence;
  if (shape.threads <= 1 || total < 2 * tuning.min_task_flops) return plan;  // inline
  if (shape.weight_bytes > tuning.cache_resident_bytes) {
    plan.mode = CpuStepPlan::Mode::kLayerOps;
    return plan;
  }
  // As many tasks as the threads and the work allow, in blocks as even as possible; blocks of
  // 16 or more are rounded up to whole row groups of 4 (the linear kernel's), which unbalances
  // the tasks by less than a fifth.
  const int64_t tasks = std::max<int64_t>(
      2, std::min<int64_t>(shape.threads, static_cast<int64_t>(total / tuning.min_task_flops)));
  int64_t block = (shape.sequences + tasks - 1) / tasks;
  if (block >= 16) block = (block + 3) / 4 * 4;
  if (block >= shape.sequences) return plan;  // one block: inline
  plan.mode = CpuStepPlan::Mode::kSequenceBlocks;
  plan.block = block;
  return plan;
}

std::string CpuDecoder::linear_kernels() const { return nn::LinearKernelsName(precision_); }

CpuStepPlan CpuDecoder::Plan(int64_t s) const {
  return PlanCpuStep(CpuStepShape{s, flops_per_sequence_, weight_bytes_, at::get_num_threads()},
                     tuning_);
}

// The buffers of `rows` sequences, carved from one float array.
struct CpuDecoder::Rows {
  float *x, *h, *qkv, *att, *tmp, *mid, *act;
  static int64_t Floats(const CpuDecoder& d, int64_t rows) {
    const Layer& l = d.layers_[0];
    return rows * (3 * d.d_ + l.qkv.out_pad + l.out.out_pad + l.mlp0.out_pad + d.mlp_);
  }
  Rows(const CpuDecoder& d, int64_t rows, float* base) {
    const Layer& l = d.layers_[0];
    x = base;
    h = x + rows * d.d_;
    att = h + rows * d.d_;
    qkv = att + rows * d.d_;
    tmp = qkv + rows * l.qkv.out_pad;
    mid = tmp + rows * l.out.out_pad;
    act = mid + rows * l.mlp0.out_pad;
  }
};

void CpuDecoder::Attention(int64_t layer, const float* qkv, int64_t qkv_stride,
                           const int64_t* positions, const int64_t* slots, int64_t row_begin,
                           int64_t row_end, int64_t head_begin, int64_t head_end,
                           PixelKvCache* cache, float* out, int64_t out_stride,
                           bool fetch_next) const {
  // Rows [row_begin, row_end) of qkv / out (0-based in these buffers) are sequences
  // row_begin.. of positions / slots; items (row, head) in row-major order between
  // (row_begin, head_begin) and (row_end - 1, head_end - 1).
  const int64_t dh = head_dim_, d = d_;
  // The rows go to the cache together, so that it can fetch each next row's memory early.
  thread_local std::vector<DecodeRow> items;
  items.clear();
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t h0 = r == row_begin ? head_begin : 0;
    const int64_t h1 = r == row_end - 1 ? head_end : heads_;
    const float* row = qkv + r * qkv_stride;
    for (int64_t hh = h0; hh < h1; ++hh) {
      DecodeRow item;
      item.slot = slots[r];
      item.head = hh;
      item.position = positions[r];
      item.q = row + hh * dh;
      item.k = row + d + hh * dh;
      item.v = row + 2 * d + hh * dh;
      if (!layers_[layer].inv_var.empty()) item.inv_var = layers_[layer].inv_var[hh];
      item.out = out + r * out_stride + hh * dh;
      items.push_back(item);
    }
  }
  cache->layer(layer).AttendRows(items.data(), static_cast<int64_t>(items.size()), Scratch(),
                                 fetch_next);
}

void CpuDecoder::ApplyBf16Blocks(const nn::Bf16Linear& b16, const float* x, int64_t rows,
                                 float* out, int64_t b0, int64_t b1) const {
  const int64_t in = b16.in(), stride = cpu::RoundUpToChunk(b16.out()), m = kBf16DecodeRows;
  nn::ThreadScratch& scratch = Scratch();
  uint16_t* halves = scratch.Halves(m * in);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t r0 = blk * m, n = std::min(m, rows - r0);
    nn::ToBf16(x + r0 * in, n * in, halves);
    if (n == m) {
      b16.Apply(halves, out + r0 * stride);
      continue;
    }
    // A short last block: zero rows below, the whole block into scratch, its rows copied out
    // (the caller's buffer may end at its last row, e.g. the logits).
    std::fill(halves + n * in, halves + m * in, uint16_t{0});
    thread_local std::vector<float> tail;
    tail.resize(static_cast<size_t>(m * stride));
    b16.Apply(halves, tail.data());
    std::copy(tail.begin(), tail.begin() + n * stride, out + r0 * stride);
  }
}

void CpuDecoder::ApplyLinear(const Linear& f32, const nn::Bf16Linear& b16, const float* x,
                             int64_t rows, float* out) const {
  if (precision_ == Precision::kBf16) {
    ApplyBf16Blocks(b16, x, rows, out, 0, Bf16Blocks(rows));
  } else {
    f32.Apply(x, rows, out, 0, Chunks(f32));
  }
}

int64_t CpuDecoder::NormOffset(const PixelKvCache& cache, int64_t slot) const {
  return class_norm_ ? cache.slot_class(slot) * d_ : 0;
}

void CpuDecoder::EmbedRow(int64_t u, int64_t position, int64_t slot, const PixelKvCache& cache,
                          float* out) const {
  const int64_t d = d_;
  const float* tok = u == PixelModel::kStartToken ? start_emb_.data() : &token_emb_[u * d];
  const float* pos = &pos_emb_[position * d];
  if (class_emb_.empty()) {
    for (int64_t i = 0; i < d; ++i) out[i] = tok[i] + pos[i];
    return;
  }
  // (token + position) + class: the reference's order of additions.
  const float* cls = &class_emb_[cache.slot_class(slot) * d];
  for (int64_t i = 0; i < d; ++i) out[i] = (tok[i] + pos[i]) + cls[i];
}

void CpuDecoder::RunRows(const int64_t* u, const int64_t* positions, const int64_t* slots,
                         int64_t begin, int64_t end, PixelKvCache* cache, float* logits) const {
  const int64_t n = end - begin, d = d_;
  const Rows b(*this, n, Scratch().Rows(Rows::Floats(*this, n)));
  u += begin;
  positions += begin;
  slots += begin;
  for (int64_t r = 0; r < n; ++r) EmbedRow(u[r], positions[r], slots[r], *cache, b.x + r * d);
  for (int64_t l = 0; l < depth_; ++l) {
    const Layer& L = layers_[l];
    for (int64_t r = 0; r < n; ++r) {
      const int64_t o = NormOffset(*cache, slots[r]);
      LayerNormRow(b.x + r * d, d, L.ln1_w.data() + o, L.ln1_b.data() + o, b.h + r * d);
    }
    ApplyLinear(L.qkv, L.qkv16, b.h, n, b.qkv);
    Attention(l, b.qkv, L.qkv.out_pad, positions, slots, 0, n, 0, heads_, cache, b.att, d);
    ApplyLinear(L.out, L.out16, b.att, n, b.tmp);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < d; ++i) b.x[r * d + i] += b.tmp[r * L.out.out_pad + i];
    for (int64_t r = 0; r < n; ++r) {
      const int64_t o = NormOffset(*cache, slots[r]);
      LayerNormRow(b.x + r * d, d, L.ln2_w.data() + o, L.ln2_b.data() + o, b.h + r * d);
    }
    ApplyLinear(L.mlp0, L.mlp016, b.h, n, b.mid);
    for (int64_t r = 0; r < n; ++r) GeluRow(b.mid + r * L.mlp0.out_pad, mlp_, b.act + r * mlp_);
    ApplyLinear(L.mlp2, L.mlp216, b.act, n, b.tmp);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < d; ++i) b.x[r * d + i] += b.tmp[r * L.mlp2.out_pad + i];
  }
  for (int64_t r = 0; r < n; ++r) {
    const int64_t o = NormOffset(*cache, slots[r]);
    LayerNormRow(b.x + r * d, d, lnf_w_.data() + o, lnf_b_.data() + o, b.h + r * d);
  }
  ApplyLinear(head_, head16_, b.h, n, logits + begin * 256);
}

void CpuDecoder::RunLayerOps(const int64_t* u, const int64_t* positions, const int64_t* slots,
                             int64_t s, PixelKvCache* cache, float* logits, bool one_sequence,
                             bool whole_image) const {
  // The same arithmetic as RunRows, op by op over all s rows; each op is split over the
  // threads where a task gets enough work, and runs inline otherwise.
  const int64_t d = d_;
  const Rows b(*this, s, Scratch().Rows(Rows::Floats(*this, s)));
  const double min_task = tuning_.min_task_flops;
  auto grain = [&](double flops_per_item) { return GrainForWork(flops_per_item, min_task); };
  auto linear = [&](const Linear& lin, const nn::Bf16Linear& b16, const nn::Bf16Linear& image,
                    const float* x, float* out) {
    if (whole_image) {
      // All s rows at once: the image GEMMs' own fixed blocks.
      uint16_t* halves = Scratch().Halves(s * lin.in);
      nn::ToBf16(x, s * lin.in, halves);
      at::parallel_for(0, image.blocks(), 1,
                       [&](int64_t b0, int64_t b1) { image.Apply(halves, out, b0, b1); });
      return;
    }
    if (precision_ == Precision::kBf16) {
      // Whole row blocks per task (each a fixed-size GEMM: the bits do not depend on the split).
      const double per_block = 2.0 * kBf16DecodeRows * lin.in * lin.out;
      at::parallel_for(0, Bf16Blocks(s), grain(per_block),
                       [&](int64_t b0, int64_t b1) { ApplyBf16Blocks(b16, x, s, out, b0, b1); });
      return;
    }
    // A chunk's multiply-adds, and its weights streamed from memory (large models).
    const double per_chunk = 2.0 * s * lin.in * cpu::kScoreChunk +
                             kFlopsPerByte * sizeof(float) * lin.in * cpu::kScoreChunk;
    at::parallel_for(0, Chunks(lin), grain(per_chunk),
                     [&](int64_t c0, int64_t c1) { lin.Apply(x, s, out, c0, c1); });
  };
  auto rows = [&](double flops_per_row, const std::function<void(int64_t)>& f) {
    at::parallel_for(0, s, grain(flops_per_row), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) f(r);
    });
  };
  rows(2.0 * d, [&](int64_t r) { EmbedRow(u[r], positions[r], slots[r], *cache, b.x + r * d); });
  // Keys an attention row reads: the window (KARM) or, on average, half the sequence (ARM); an
  // item's work counts its multiply-adds and the keys and values it streams from memory (as a
  // linear's chunk counts its weights), so that a step of few sequences still splits its
  // attention over the threads when the caches are long.
  const double keys =
      kind_ == AttentionKind::kKrause ? static_cast<double>(cache_length_) : cache_length_ / 2.0;
  const double attention_item =
      keys * 4.0 * head_dim_ + kFlopsPerByte * 2.0 * sizeof(float) * keys * head_dim_;
  for (int64_t l = 0; l < depth_; ++l) {
    const Layer& L = layers_[l];
    rows(8.0 * d, [&](int64_t r) {
      const int64_t o = NormOffset(*cache, slots[r]);
      LayerNormRow(b.x + r * d, d, L.ln1_w.data() + o, L.ln1_b.data() + o, b.h + r * d);
    });
    linear(L.qkv, L.qkv16, L.qkv16_image, b.h, b.qkv);
    if (one_sequence) {
      // Rows of one sequence: each row's attention reads what the rows before it appended, so
      // the rows go in order; heads are independent (disjoint cache memory). The sequence's
      // rings stay in the core's cache: no fetching ahead.
      at::parallel_for(0, heads_, grain(s * attention_item), [&](int64_t h0, int64_t h1) {
        for (int64_t r = 0; r < s; ++r)
          Attention(l, b.qkv, L.qkv.out_pad, positions, slots, r, r + 1, h0, h1, cache, b.att, d,
                    /*fetch_next=*/false);
      });
    } else {
      at::parallel_for(0, s * heads_, grain(attention_item), [&](int64_t w0, int64_t w1) {
        Attention(l, b.qkv, L.qkv.out_pad, positions, slots, w0 / heads_, (w1 - 1) / heads_ + 1,
                  w0 % heads_, (w1 - 1) % heads_ + 1, cache, b.att, d);
      });
    }
    linear(L.out, L.out16, L.out16_image, b.att, b.tmp);
    rows(8.0 * d, [&](int64_t r) {
      for (int64_t i = 0; i < d; ++i) b.x[r * d + i] += b.tmp[r * L.out.out_pad + i];
      const int64_t o = NormOffset(*cache, slots[r]);
      LayerNormRow(b.x + r * d, d, L.ln2_w.data() + o, L.ln2_b.data() + o, b.h + r * d);
    });
    linear(L.mlp0, L.mlp016, L.mlp016_image, b.h, b.mid);
    rows(20.0 * mlp_,
         [&](int64_t r) { GeluRow(b.mid + r * L.mlp0.out_pad, mlp_, b.act + r * mlp_); });
    linear(L.mlp2, L.mlp216, L.mlp216_image, b.act, b.tmp);
    rows(2.0 * d, [&](int64_t r) {
      for (int64_t i = 0; i < d; ++i) b.x[r * d + i] += b.tmp[r * L.mlp2.out_pad + i];
    });
  }
  rows(8.0 * d, [&](int64_t r) {
    const int64_t o = NormOffset(*cache, slots[r]);
    LayerNormRow(b.x + r * d, d, lnf_w_.data() + o, lnf_b_.data() + o, b.h + r * d);
  });
  linear(head_, head16_, head16_image_, b.h, logits);
}

absl::Status CpuDecoder::CheckCache(const PixelKvCache* cache) const {
  if (cache == nullptr) return absl::InvalidArgumentError("cache is null");
  // The cache must be this model's, on the CPU, fp32 (or a KARM's bf16 rings: the decode kernel
  // reads both).
  if (cache->kind() != kind_ || cache->layers() != depth_) {
    return absl::InvalidArgumentError("cache was made for another kind of model");
  }
  for (int64_t l = 0; l < depth_; ++l) {
    const LayerKvCache& layer = cache->layer(l);
    const bool dtype_ok = layer.dtype() == at::kFloat ||
                          (kind_ == AttentionKind::kKrause && layer.dtype() == at::kBFloat16);
    if (!layer.device().is_cpu() || !dtype_ok || layer.heads() != heads_ ||
        layer.head_dim() != head_dim_ || layer.length() != cache_length_) {
      return absl::InvalidArgumentError(
          "cache must be a CPU cache (fp32, or bf16 rings) made for this model's config");
    }
  }
  if (cache->conditional() != !class_emb_.empty()) {
    return absl::InvalidArgumentError(
        "the cache and the decoder disagree on class conditioning (a cache of another model)");
  }
  return absl::OkStatus();
}

absl::Status CpuDecoder::CheckToken(const int64_t* u, int64_t i) const {
  const bool start = start_token_ && u[i] == PixelModel::kStartToken;
  if (!start && (u[i] < 0 || u[i] > 255)) {
    return absl::InvalidArgumentError(absl::StrCat("u[", i, "] = ", u[i], " is not a pixel value",
                                                   start_token_ ? " or the start token (256)" : "",
                                                   ""));
  }
  return absl::OkStatus();
}

absl::Status CpuDecoder::Prefill(const int64_t* u, int64_t t, int64_t slot, PixelKvCache* cache,
                                 float* logits) const {
  RETURN_IF_ERROR(CheckCache(cache));
  if (t < 1 || t > seq_len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a prefill of ", t, " positions; between 1 and ", seq_len_, " (N)"));
  }
  if (slot < 0 || slot >= cache->slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " is outside [0, ", cache->slots(), ")"));
  }
  for (int64_t i = 0; i < t; ++i) RETURN_IF_ERROR(CheckToken(u, i));
  std::vector<int64_t> positions(t), slots(t, slot);
  for (int64_t i = 0; i < t; ++i) positions[i] = i;
  try {
    at::NoGradGuard no_grad;
    RunLayerOps(u, positions.data(), slots.data(), t, cache, logits, /*one_sequence=*/true);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("prefill failed: ", ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> CpuDecoder::BitsPerDim(const int64_t* images, int64_t b,
                                                           const int64_t* class_rows) const {
  const int64_t n = seq_len_;
  if (b < 0) return absl::InvalidArgumentError(absl::StrCat("b must be >= 0, got ", b));
  for (int64_t i = 0; i < b * n; ++i) {
    if (images[i] < 0 || images[i] > 255) {
      return absl::InvalidArgumentError(absl::StrCat("image ", i / n, ", subpixel ", i % n, ": ",
                                                     images[i], " is not in [0, 255]"));
    }
  }
  const bool conditional = !class_emb_.empty();
  if (conditional && class_rows != nullptr) {
    for (int64_t i = 0; i < b; ++i) {
      if (class_rows[i] < 0 || class_rows[i] > config_.null_class()) {
        return absl::InvalidArgumentError(absl::StrCat("image ", i, ": class row ", class_rows[i],
                                                       " is outside [0, ", config_.null_class(),
                                                       "]"));
      }
    }
  }
  std::vector<double> bits(static_cast<size_t>(b));
  if (b == 0) return bits;
  // With a start token the N positions predict x_0..x_{N-1}; without one, the N - 1 positions
  // predict x_1..x_{N-1} (PixelModel::NllPerImage).
  const int64_t t = start_token_ ? n : n - 1, first_target = start_token_ ? 0 : 1;
  // As many images at once as threads, each on one thread with its own cache slot; fewer images
  // than threads (a Score chunk of one image) go one after another, each spread over the
  // threads by the layers' own parallel regions. An image's bits are the same either way (fixed
  // GEMM blocks, rows normed and attended one by one).
  const int threads = std::max(1, at::get_num_threads());
  const int64_t tasks = b < threads ? 1 : std::min<int64_t>(b, threads);
  ASSIGN_OR_RETURN(PixelKvCache cache, PixelKvCache::Create(config_, tasks));
  std::vector<absl::Status> failed(static_cast<size_t>(tasks));
  // Task k scores images k, k + tasks, ... in slot k.
  auto run_task = [&](int64_t k) {
    std::vector<int64_t> u(static_cast<size_t>(t)), positions(static_cast<size_t>(t));
    const std::vector<int64_t> slots(static_cast<size_t>(t), k);
    std::vector<float> logits(static_cast<size_t>(t * 256));
    for (int64_t p = 0; p < t; ++p) positions[p] = p;
    for (int64_t i = k; i < b; i += tasks) {
      const int64_t* x = images + i * n;
      if (start_token_) {
        u[0] = PixelModel::kStartToken;
        std::copy(x, x + n - 1, u.begin() + 1);
      } else {
        std::copy(x, x + n - 1, u.begin());
      }
      try {
        // Inference mode on every task's thread: a worker does not inherit the caller's, and a
        // cache made in it holds inference tensors, which SetClass may update only in it.
        const c10::InferenceMode inference;
        if (conditional) {
          cache.SetClass(k, class_rows != nullptr ? class_rows[i] : config_.null_class());
        }
        RunLayerOps(u.data(), positions.data(), slots.data(), t, &cache, logits.data(),
                    /*one_sequence=*/true, /*whole_image=*/precision_ == Precision::kBf16);
      } catch (const std::exception& e) {
        failed[k] = absl::InternalError(absl::StrCat("scoring failed: ", ExceptionMessage(e)));
        return;
      }
      double nll = 0;
      for (int64_t p = 0; p < t; ++p) {
        const float* row = logits.data() + p * 256;
        const float top = *std::max_element(row, row + 256);
        double sum = 0;
        for (int64_t v = 0; v < 256; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
        nll += std::log(sum) + top - row[x[p + first_target]];
      }
      bits[i] = nll / static_cast<double>(t) / std::log(2.0);
    }
  };
  if (tasks == 1) {
    run_task(0);
  } else {
    at::parallel_for(0, tasks, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) run_task(k);
    });
  }
  for (const absl::Status& st : failed) RETURN_IF_ERROR(st);
  return bits;
}

absl::Status CpuDecoder::Step(const int64_t* u, const int64_t* positions, const int64_t* slots,
                              int64_t s, PixelKvCache* cache, float* logits,
                              std::optional<CpuStepPlan::Mode> force) const {
  RETURN_IF_ERROR(CheckCache(cache));
  if (s < 0) return absl::InvalidArgumentError(absl::StrCat("s must be >= 0, got ", s));
  if (s == 0) return absl::OkStatus();
  const int64_t cache_slots = cache->slots();
  std::vector<char>& seen = Scratch().seen;
  seen.assign(static_cast<size_t>(cache_slots), 0);
  for (int64_t i = 0; i < s; ++i) {
    if (slots[i] < 0 || slots[i] >= cache_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("slots[", i, "] = ", slots[i], " is outside [0, ", cache_slots, ")"));
    }
    if (seen[slots[i]]) {
      return absl::InvalidArgumentError(
          absl::StrCat("slots[", i, "] = ", slots[i], " appears twice in one step"));
    }
    seen[slots[i]] = 1;
    if (positions[i] < 0 || positions[i] >= seq_len_) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions[", i, "] = ", positions[i], " is outside [0, ", seq_len_, ")"));
    }
    RETURN_IF_ERROR(CheckToken(u, i));
  }
  const CpuStepPlan plan = Plan(s);
  const CpuStepPlan::Mode mode = force.value_or(plan.mode);
  try {
    at::NoGradGuard no_grad;
    switch (mode) {
      case CpuStepPlan::Mode::kInline:
        RunRows(u, positions, slots, 0, s, cache, logits);
        break;
      case CpuStepPlan::Mode::kSequenceBlocks: {
        // A forced mode without a planned block: two blocks.
        const int64_t block = plan.mode == mode ? plan.block : std::max<int64_t>(1, (s + 1) / 2);
        const int64_t blocks = (s + block - 1) / block;
        at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
          for (int64_t b = b0; b < b1; ++b)
            RunRows(u, positions, slots, b * block, std::min(s, (b + 1) * block), cache, logits);
        });
        break;
      }
      case CpuStepPlan::Mode::kLayerOps:
        RunLayerOps(u, positions, slots, s, cache, logits);
        break;
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("decode step failed: ", ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

}  // namespace krause
