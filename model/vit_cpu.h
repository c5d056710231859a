// The CPU inference forward of a classifier (Krause ViT or its softmax ViT baseline) without
// LibTorch's op dispatch: what the classify batcher runs on the CPU.
//
// Why: the bundled classifier is small (d 64, 4 layers, 50 tokens): one image is 13.6 MFLOP, a
// fraction of a millisecond of arithmetic, while ViT::Forward spends most of its ~2 ms at batch 1
// in ~120 dispatched LibTorch ops (allocations, checks, thread fan-out of tiny ops). Here the
// weights are packed once (nn/packed.h: q/k/v fused, the patch convolution as a linear layer over
// patches) and each image runs as raw loops over per-thread scratch: the patch embedding, the
// post-LN blocks (the Krause layers through the fused prefill kernel over the cached grid
// candidate table, the softmax layers as dense rows), the final norm, the head and the softmax.
//
// Every image is computed on its own with the same kernels in the same order, so its
// probabilities have the same bits alone or in any batch and on any thread split. A batch is split
// over the threads by images, in tasks of at least kMinParallelForwardFlops / 2 (util/threads.h),
// each thread taking the next image left: small batches run on the calling thread. A batch of fewer
// images than threads whose images each cost at least 2 x kMinParallelForwardFlops (a paper-size
// ViT: 8.6 GFLOP) runs one image at a time on all threads instead, two parallel regions a layer:
// one over the heads, one over blocks of rows (the out projection, norms, MLP and the next layer's
// q/k/v); no sum is split, so the bits stay the same (bf16: the GEMMs' own fixed row blocks,
// nn/dnnl_linear.h). Softmax attention runs through the softmax kernel (cpu_kernels.h, not causal).
//
// Reference: ViT::Forward (LibTorch ops); tests compare the probabilities within 1e-5.
// Thread-safety: immutable after Create; Forward may run concurrently (scratch is per thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/attention/neighbourhood.h"
#include "model/nn/dnnl_linear.h"
#include "model/nn/packed.h"
#include "model/precision.h"
#include "model/vit.h"

namespace krause {

class CpuViT {
 public:
  // Packs the model's current weights (any dtype on any device; fp32 CPU copies, the linear layers'
  // in bfloat16 when the model's were rounded: ParameterStore::RoundLinear). `precision` kBf16
  // runs the blocks' linear layers (q/k/v, out, MLP) as bf16 GEMMs through oneDNN
  // (nn/dnnl_linear.h); the patch embedding, the head, attention, norms and GELU stay fp32. On a
  // CPU without AMX the model packs for fp32 instead: precision() then says fp32
  // and fallback() why.
  static absl::StatusOr<std::unique_ptr<CpuViT>> Create(const ViT& model,
                                                        Precision precision = Precision::kFp32);

  // How a batch is spread over the intra-op threads: kAuto chooses (see above); kImages runs whole
  // images per thread; kWithinImage runs one image at a time on all threads. The bits are the
  // same either way (tests force both).
  enum class Split { kAuto, kImages, kWithinImage };
  // pixels: `images` images [C, H, W] uint8, contiguous, the model's shape, normalised as
  // NormalizePixels does. Writes softmax probabilities [images, classes] (row-major) to `probs`.
  // InvalidArgument for images < 0. `before_image` (may be empty): when the batch is split by
  // images, called with an image's index on the thread about to compute it, before it does, so
  // a caller can slip other work in between two images (its own forwards included: they run on
  // that thread alone); it must not throw.
  absl::Status Forward(const uint8_t* pixels, int64_t images, float* probs,
                       Split split = Split::kAuto,
                       const std::function<void(int64_t image)>& before_image = {}) const;

  int64_t classes() const { return classes_; }
  // The precision it runs (kFp32 after a fallback) and, after a fallback, the reason.
  Precision precision() const { return precision_; }
  const std::string& fallback() const { return fallback_; }
  // What computes the linear layers: the packed kernels' variant ("avx512"), or oneDNN's kernel
  // for bf16 ("onednn brg:avx512_core_amx").
  std::string linear_kernels() const;
  double flops_per_image() const { return flops_per_image_; }
  // The packed linear layers' bytes (weights and biases: what a forward streams through).
  int64_t weight_bytes() const;

 private:
  CpuViT() = default;
  // One image; with `parallel` its steps split over the intra-op threads (the same bits).
  void Image(const uint8_t* pixels, float* probs, bool parallel) const;

  struct Layer {
    nn::PackedLinear qkv, out, mlp0, mlp2;        // fp32
    nn::Bf16Linear qkv16, out16, mlp016, mlp216;  // bf16
    std::vector<float> norm1_w, norm1_b, norm2_w, norm2_b;
    float inv_var = 1;  // Krause: 1 / sigma^2
    int64_t top_k = 1;
  };
  Precision precision_ = Precision::kFp32;
  std::string fallback_;
  bool krause_ = true, cls_ = true;
  int64_t channels_ = 1, size_ = 28, patch_ = 4, grid_ = 7, tokens_ = 50;
  int64_t d_ = 64, heads_ = 4, head_dim_ = 16, mlp_ = 128, classes_ = 10;
  std::vector<float> mean_, std_;  // per channel; empty: none
  nn::PackedLinear patch_embed_;   // [C * p * p] -> D
  std::vector<float> cls_token_, pos_embed_;
  std::vector<Layer> layers_;
  std::vector<float> norm_w_, norm_b_;
  nn::PackedLinear head_;
  std::shared_ptr<const CandidateTable> table_;  // Krause: the grid's candidates
  float softmax_scale_ = 1;                      // softmax: 1 / sqrt(head_dim)
  double flops_per_image_ = 0;
};

}  // namespace krause
