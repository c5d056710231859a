// The generation engine: continuous batching of autoregressive pixel generation over KV caches.
//
// Requests (an optional prompt of the first P subpixels, sampling parameters with a seed) are
// submitted from any thread; the engine thread calls Step() repeatedly. Each Step admits waiting
// requests while cache slots are free (running the prefill over their prompt), then adds one
// subpixel to every active sequence with ONE batched decode step over sequences at different
// positions, delivers the new pixels, and lets finished and cancelled sequences leave, freeing
// their slots. A full pool makes requests wait; it is not an error.
//
// Reproducibility: pixel i of a request is drawn from (seed, i) only (sampling.h), and every
// kernel of the decode step works per sequence, so a request gives the same image alone or
// batched with any others, joining at any step.
//
// Devices: the engine runs where the model's parameters are. On the CPU the decode step is the
// packed CpuDecoder (cpu_decoder.h: batch-invariant, its thread use sized to the step; the
// guarantee above holds bit for bit). On a GPU
// (CUDA builds) the cache lives on the GPU, the step runs on the engine's own CUDA stream under
// InferenceMode with plain linear layers (cuBLAS picks its kernels by batch size, so there an
// image is reproducible for the same seed and the same batch composition, not across batch
// compositions), and tokens go up and logits come down through pinned host buffers.
//
// Ownership and threading: the engine borrows the model (which must outlive it) and owns its
// cache. Submit() and Cancel() are thread-safe; Step() and the accessors belong to one engine
// thread. Callbacks run on the engine thread, inside Step(); on_done runs exactly once per
// accepted request, after its last on_pixel.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "model/engine/cpu_decoder.h"
#include "model/engine/decode_graphs.h"
#include "model/engine/device_context.h"
#include "model/engine/sampling.h"
#include "model/engine/slot_pool.h"
#include "model/kv_cache.h"
#include "model/pixel_model.h"

namespace krause {

struct GenerationRequest {
  std::vector<uint8_t> prompt;  // the first P subpixels in raster order; P <= N - 1
  SamplingParams sampling;
  // Conditional models: the class to draw, 0..classes-1, or -1 for none (unconditional
  // sampling). Unconditional models: must be -1.
  int64_t label = -1;
  // Classifier-free guidance (conditional models, with a class): each subpixel is drawn from
  // logits u + guidance * (c - u), c given the class and u given the null class. 1 (the
  // default) is plain conditional sampling; any other value in [0, kMaxGuidance] runs the
  // sequence twice per step (a second cache slot, a second row of the decode step, a second
  // prefill of the prompt): twice the compute and cache of an unguided image.
  double guidance = 1.0;
  static constexpr double kMaxGuidance = 20.0;
  bool guided() const { return guidance != 1.0; }
  // Cache slots (and rows of every decode step) an image takes at this guidance: 2 when
  // guided, else 1.
  static int64_t SlotsFor(double guidance) { return guidance != 1.0 ? 2 : 1; }
  int64_t slots() const { return SlotsFor(guidance); }
  // Pixel index, value: called for every generated subpixel, in order.
  std::function<void(int64_t, uint8_t)> on_pixel;
  // Optional: called once when the request gets a cache slot (before its prefill).
  std::function<void()> on_admitted;
  // Final status (OK, Cancelled, Internal) and the whole image's N subpixels (prompt included)
  // on OK.
  std::function<void(absl::Status, std::vector<uint8_t>)> on_done;
};

struct EngineOptions {
  int64_t max_sequences = 64;   // cache slots
  int64_t max_cache_bytes = 0;  // if > 0, also limits the slots to what fits in these bytes
  // A KARM on a GPU: replay each step as a CUDA graph per batch size (decode_graphs.h). Ignored
  // where graphs do not apply (the CPU, the ARM, LibTorch 1.13).
  bool cuda_graphs = false;
  // A KARM on a GPU: its ring caches' keys and values in bf16 or fp16 (half the bytes a decode
  // step reads; keys rounded when stored) instead of fp32. InvalidArgument elsewhere.
  at::ScalarType cache_dtype = at::kFloat;
};

struct StepStats {
  int64_t admitted = 0;   // sequences prefilled this step
  int64_t prefill_tokens = 0;   // positions those prefills ran
  double prefill_seconds = 0;   // wall time of the admissions (prefills)
  double decode_seconds = 0;    // wall time of the decode step and the draws
  int64_t batch = 0;            // rows of the decode step: sequences, plus one per guided sequence
  int64_t sequences = 0;        // sequences in the decode step (each got one subpixel)
  int64_t finished = 0;   // left with OK
  int64_t cancelled = 0;  // left cancelled
  int64_t failed = 0;     // left with an error
};

class DecodeEngine {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(const PixelModel* model,
                                                              const EngineOptions& options);

  // Validates (InvalidArgument naming the field and limit) and queues. Returns the request id.
  absl::StatusOr<int64_t> Submit(GenerationRequest request);
  // The request leaves at the next step with Cancelled (no effect once it has finished).
  void Cancel(int64_t id);

  // One scheduling step (engine thread): admits up to `max_admit` waiting requests (oldest
  // first, while slots are free), then decodes every active sequence. Returns what happened.
  StepStats Step(int64_t max_admit = std::numeric_limits<int64_t>::max());
  // The prefill positions of the waiting requests that `free_slots` slots admit, oldest first
  // (what admitting them would cost, a guided request's two prefills counted; for the worker's
  // plan).
  std::vector<int64_t> WaitingPrefillTokens(int64_t free_slots) const;
  int64_t free_slots() const { return pool_.capacity() - pool_.in_use(); }
  // True while anything is queued or active.
  bool Busy() const;

  int64_t active() const { return static_cast<int64_t>(active_.size()); }
  int64_t waiting() const;
  const SlotPool& pool() const { return pool_; }
  int64_t bytes_per_sequence() const {
    return PixelKvCache::BytesPerSequence(model_->config(), cache_dtype_);
  }
  const at::Device& device() const { return device_.device(); }
  // The CUDA graphs of the decode step (null unless EngineOptions::cuda_graphs applied).
  const DecodeGraphs* graphs() const { return graphs_.get(); }

 private:
  struct Sequence {
    int64_t id = 0;
    GenerationRequest request;
    int64_t slot = -1;
    int64_t guide_slot = -1;  // guided: the slot decoding the same pixels with the null class
    int64_t position = 0;  // model position of the next decode step
    int64_t input = 0;     // model-input token at that position
    std::vector<uint8_t> pixels;
  };

  DecodeEngine(const PixelModel* model, PixelKvCache cache, int64_t slots,
               const EngineOptions& options);
  // The decode step over the active sequences and their guide slots: logits [rows, 256] on the
  // host (host_logits_); sets *rows and guide_rows_.
  const float* RunDecodeStep(int64_t* rows);
  // Draws per parallel task: below twice this a step samples on the engine thread.
  static constexpr int64_t kSamplesPerTask = 16;
  absl::Status Admit(Sequence* s);  // prefill into a committed slot
  void Finish(Sequence* s, absl::Status status, StepStats* stats);

  const PixelModel* model_;
  at::ScalarType cache_dtype_ = at::kFloat;
  const DeviceContext device_;
  // Batch-invariant linear layers (CPU only) and the Krause layers' scales (any device).
  const PixelDecodeWeights packed_;
  PixelKvCache cache_;
  std::unique_ptr<DecodeGraphs> graphs_;
  // Host staging for one decode step (pinned on a GPU): tokens, positions, slots; logits.
  at::Tensor host_u_, host_pos_, host_slots_, host_logits_;
  SlotPool pool_;
  std::vector<std::unique_ptr<Sequence>> active_;
  std::vector<uint8_t> samples_;  // this step's draws, per active sequence
  // The decode-step row of each active sequence's guide slot (-1: unguided).
  std::vector<int64_t> guide_rows_;

  mutable std::mutex mu_;  // guards the two members below and next_id_
  std::deque<std::unique_ptr<Sequence>> pending_;
  std::set<int64_t> cancelled_;
  int64_t next_id_ = 1;
};

// GenerationRequest::guidance with `label` (-1: none): InvalidArgument when a guidance other
// than 1 has no class ("guidance G needs a class ...") or lies outside [0, kMaxGuidance].
absl::Status ValidateGuidance(double guidance, int64_t label);

// Bits per dimension of images under a generator (teacher-forced), per image.
// images: [B, N] (uint8 or int64, raster order). labels: empty, or one class per image (-1: none)
// for a conditional model's conditional bits/dim. InvalidArgument on a shape, value or class
// mismatch.
absl::StatusOr<std::vector<double>> ScoreBitsPerDim(const PixelModel& model,
                                                    const at::Tensor& images,
                                                    const std::vector<int64_t>& labels = {});

}  // namespace krause
