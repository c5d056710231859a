// The CPU decode step of a generator (KARM or its softmax ARM baseline) without LibTorch's op
// dispatch: what the decode engine runs on the CPU.
//
// Why: the bundled generators are small (d 32, 3 layers): one decode step is a few microseconds of
// arithmetic per sequence, while the same step written as LibTorch ops costs ~80 dispatched ops,
// each an allocation and, through at::parallel_for, a fork/join of the intra-op pool. A profile of
// the server generating one image spent ~60% of its cycles waking and sleeping pool threads.
// Here the weights are packed once (fp32, transposed, q/k/v fused into one matrix) and a step is
// raw loops over preallocated per-thread scratch, with ONE decision per step of how to use the
// threads (PlanCpuStep):
//   kInline          everything on the calling thread (little work: one or a few sequences);
//   kSequenceBlocks  one parallel region: each task runs the whole step for a block of sequences
//                    (the weights fit in a core's cache, so each task re-reading them is cheap);
//   kLayerOps        op by op over all sequences, each op split over the threads where it is big
//                    enough (large models: the weights are read once per step, not once per
//                    block).
// Every mode computes a sequence's row with the same kernels in the same order (the
// batch-invariant linear rows of cpu_kernels.h, per-row layer norms, the fused decode kernel of
// the attention), so a sequence's logits have the same bits whatever the mode, the batch and the
// other sequences: the engine's reproducibility guarantee. Tests force each mode.
//
// The attention of each (sequence, head) is the cache's (kv_cache.h, LayerKvCache::AttendRows):
// the decoder never touches cache storage itself.
//
// Precision (model/precision.h): fp32 as above; bf16 runs every linear layer through oneDNN
// (nn/dnnl_linear.h: bfloat16 weights and activations, fp32 sums, AMX) in FIXED blocks of
// kBf16DecodeRows rows, the last block of a call padded with zero rows. A row's bits then depend
// only on its own inputs, never on how many rows a step has or which share its block, so the
// guarantee above holds in bf16 too (on a given CPU and oneDNN). Attention, its Krause selection,
// norms and GELU stay the fp32 kernels'. A CPU without AMX falls back to fp32 (fallback() says
// why).
//
// Reference: PixelModel::DecodeStep without packed weights (LibTorch ops); tests compare against
// it and against the teacher-forced forward.
//
// Thread-safety: a decoder is immutable after Create; Step may run concurrently for different
// caches (scratch is per thread). It borrows nothing from the model after Create.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/nn/dnnl_linear.h"
#include "model/nn/packed.h"
#include "model/pixel_model.h"
#include "model/precision.h"
#include "model/util/threads.h"

namespace krause {

class PixelKvCache;

// How one decode step uses the threads (a pure function of its size; see PlanCpuStep).
struct CpuStepPlan {
  enum class Mode { kInline, kSequenceBlocks, kLayerOps };
  Mode mode = Mode::kInline;
  int64_t block = 1;  // kSequenceBlocks: sequences per task
};

struct CpuStepShape {
  int64_t sequences = 1;
  double flops_per_sequence = 0;  // one step of one sequence
  int64_t weight_bytes = 0;       // packed weights the step reads
  int threads = 1;                // intra-op threads available
};

// Thresholds of PlanCpuStep, measured on 2-core x86-64 machines with bench/generate_bench.cc's
// --modes table: a fork/join of the pool costs tens of microseconds when its threads sleep,
// so a step parallelises only when each task gets at least `min_task_flops`.
struct CpuStepTuning {
  double min_task_flops = kMinTaskFlops;
  int64_t cache_resident_bytes = 512 << 10;  // weights at most this: kSequenceBlocks
};

// Inline when one thread is available or the work would give a second task less than
// min_task_flops; else kSequenceBlocks for cache-resident weights (even blocks, those of 16 or
// more rounded to the linear kernel's row group of 4) and kLayerOps for larger ones.
CpuStepPlan PlanCpuStep(const CpuStepShape& shape, const CpuStepTuning& tuning = {});

// The rows of every bf16 GEMM call of the decoder: one AMX tile's height.
constexpr int64_t kBf16DecodeRows = 16;

class CpuDecoder final : public PackedDecodeStep {
 public:
  // Packs the model's current weights (any dtype on the CPU; fp32 copies). `tuning` sets the
  // plan's thresholds and, in kLayerOps, the smallest piece an op is split into.
  // `precision` kBf16 also makes the linear layers' bf16 GEMMs (a CPU without AMX: fp32, and
  // fallback() says why).
  static absl::StatusOr<std::unique_ptr<CpuDecoder>> Create(const PixelModel& model,
                                                            const CpuStepTuning& tuning = {},
                                                            Precision precision = Precision::kFp32);

  // One decode step for s sequences (host arrays of s entries): u[i] the model-input token of
  // sequence i at model position positions[i], in cache slot slots[i]; the slot holds that
  // sequence's earlier positions. Appends the new keys and values to the cache and writes
  // logits [s, 256] (row-major) to `logits`. InvalidArgument naming the entry for a token,
  // position or slot out of range or a slot given twice; nothing is written then.
  absl::Status Step(const int64_t* u, const int64_t* positions, const int64_t* slots, int64_t s,
                    PixelKvCache* cache, float* logits) const override {
    return Step(u, positions, slots, s, cache, logits, std::nullopt);
  }
  // The same with `force` overriding the plan (tests and benchmarks).
  absl::Status Step(const int64_t* u, const int64_t* positions, const int64_t* slots, int64_t s,
                    PixelKvCache* cache, float* logits,
                    std::optional<CpuStepPlan::Mode> force) const;

  // PackedDecodeStep::Prefill: the t positions of one sequence as t rows of one pass, op by op
  // over the rows (linear layers split over the threads where big enough), each layer's
  // attention row by row in position order (a row reads what the rows before it appended),
  // heads in parallel. Every row's arithmetic is a single-sequence Step's, so the cache and the
  // logits are bit for bit those of t Steps. (The LibTorch prefill, PixelModel::Prefill without
  // packed weights, agrees within rounding only.)
  absl::Status Prefill(const int64_t* u, int64_t t, int64_t slot, PixelKvCache* cache,
                       float* logits) const override;

  // Bits per dimension of b images (teacher-forced: each image one Prefill of its N subpixels,
  // or N - 1 without a start token), images [b, N] subpixels in [0, 255] row-major;
  // class_rows: null, or each image's class row (PixelModelConfig::ClassRow) for a conditional
  // model. The images are spread over the threads, each on one thread with its own cache slot
  // (fewer images than threads: one after another, each over all threads); an image's value
  // does not depend on the others, the thread count or the split. In fp32 the logits
  // are a Prefill's bits (PixelModel::NllPerImage agrees within rounding); in bf16 the GEMMs
  // take an image's positions in blocks of up to 128 rows (fixed by N: AMX runs them several
  // times faster than 16-row blocks), so they agree with a Prefill within rounding. The
  // log-softmax and the mean are summed in double. InvalidArgument for a subpixel or class out of
  // range.
  absl::StatusOr<std::vector<double>> BitsPerDim(const int64_t* images, int64_t b,
                                                 const int64_t* class_rows = nullptr) const;

  // The plan Step would use for s sequences with the current intra-op threads.
  CpuStepPlan Plan(int64_t s) const;
  // The precision the linear layers run (kFp32 after a fallback) and, after one, the reason.
  Precision precision() const { return precision_; }
  const std::string& fallback() const { return fallback_; }
  // What computes the linear layers: the CPU kernels' variant ("avx512"), or in bf16 oneDNN's
  // matmul ("onednn brg:avx512_core_amx").
  std::string linear_kernels() const;
  double flops_per_sequence() const { return flops_per_sequence_; }
  int64_t weight_bytes() const { return weight_bytes_; }

  using Linear = nn::PackedLinear;
  // A LayerNorm's weight and bias: [D] each, or with class_norm [classes + 1, D] each, the
  // class's scale and shift folded in (w (1 + scale[c]), b (1 + scale[c]) + shift[c]).
  struct Layer {
    std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
    Linear qkv;  // columns: q [0, D), k [D, 2D), v [2D, 3D)
    Linear out, mlp0, mlp2;
    std::vector<float> inv_var;  // KARM: 1 / sigma^2 per head
    // Precision kBf16: the same layers' bf16 GEMMs, kBf16DecodeRows rows a call (steps,
    // prefills) and a whole image's positions a call (BitsPerDim: blocks of up to 128 rows).
    nn::Bf16Linear qkv16, out16, mlp016, mlp216;
    nn::Bf16Linear qkv16_image, out16_image, mlp016_image, mlp216_image;
  };

 private:
  CpuDecoder() = default;
  struct Rows;  // a task's scratch rows
  // out (rows out_pad apart) = x (rows `in` apart) W^T + b over `rows` rows: the packed fp32
  // kernel's column chunks [c0, c1), or in bf16 every column of the row blocks [b0, b1)
  // (kBf16DecodeRows rows each, the last maybe padded). On the calling thread.
  void ApplyLinear(const Linear& f32, const nn::Bf16Linear& b16, const float* x, int64_t rows,
                   float* out) const;
  void ApplyBf16Blocks(const nn::Bf16Linear& b16, const float* x, int64_t rows, float* out,
                       int64_t b0, int64_t b1) const;
  void RunRows(const int64_t* u, const int64_t* positions, const int64_t* slots, int64_t begin,
               int64_t end, PixelKvCache* cache, float* logits) const;
  // one_sequence: the rows are consecutive positions of one sequence (Prefill): attention row
  // by row in order, heads in parallel.
  // whole_image (bf16, BitsPerDim): the rows are an image's positions and the linear layers
  // run the *_image GEMMs.
  void RunLayerOps(const int64_t* u, const int64_t* positions, const int64_t* slots, int64_t s,
                   PixelKvCache* cache, float* logits, bool one_sequence = false,
                   bool whole_image = false) const;
  absl::Status CheckCache(const PixelKvCache* cache) const;  // Step's and Prefill's checks
  absl::Status CheckToken(const int64_t* u, int64_t i) const;
  // Row r's input: token (or start) embedding + position embedding (+ the slot's class
  // embedding of a conditional model), into out [D].
  void EmbedRow(int64_t u, int64_t position, int64_t slot, const PixelKvCache& cache,
                float* out) const;
  // The offset of row r's LayerNorm weights and biases: its slot's class row with class_norm,
  // else 0.
  int64_t NormOffset(const PixelKvCache& cache, int64_t slot) const;
  void Attention(int64_t layer, const float* qkv, int64_t qkv_stride, const int64_t* positions,
                 const int64_t* slots, int64_t row_begin, int64_t row_end, int64_t head_begin,
                 int64_t head_end, PixelKvCache* cache, float* out, int64_t out_stride,
                 bool fetch_next = true) const;

  AttentionKind kind_ = AttentionKind::kKrause;
  bool start_token_ = true;
  int64_t d_ = 0, heads_ = 0, head_dim_ = 0, depth_ = 0, mlp_ = 0, seq_len_ = 0;
  int64_t cache_length_ = 0;  // positions a slot of this model's cache holds (W or N)
  std::vector<float> token_emb_, pos_emb_, start_emb_;  // [256, D], [N, D], [D]
  std::vector<float> class_emb_;  // conditional models: [classes + 1, D]; else empty
  bool class_norm_ = false;       // LayerNorm weights per class (PixelModelConfig::class_norm)
  std::vector<Layer> layers_;
  std::vector<float> lnf_w_, lnf_b_;
  Linear head_;
  nn::Bf16Linear head16_, head16_image_;
  Precision precision_ = Precision::kFp32;
  std::string fallback_;
  PixelModelConfig config_;
  double flops_per_sequence_ = 0;
  int64_t weight_bytes_ = 0;
  CpuStepTuning tuning_;
};

// What DecodeStep reuses for `model`: on the CPU the packed step (a CpuDecoder), on any device
// the Krause layers' scales. Throws (c10::Error) on weights the step cannot use (a bad
// log_sigma); call again after loading new weights.
// `precision`: the packed CPU step's (CpuDecoder::Create).
PixelDecodeWeights PackForDecode(const PixelModel& model, Precision precision = Precision::kFp32);

}  // namespace krause
