// The generation engine: continuous batching of autoregressive pixel generation over KV caches.
//
// Requests (an optional prompt of the first P subpixels, sampling parameters with a seed) are
// submitted from any thread; the engine thread calls Step() repeatedly. Each Step lets cancelled
// requests leave, admits the waiting requests an AdmissionPlan names (admission.h: the one
// admission rule; Step() without a plan makes one that admits whatever fits) and runs their
// prefill, then adds one subpixel to every active sequence with ONE batched decode step over
// sequences at different positions, and lets finished sequences leave, freeing their slots. A
// full pool makes requests wait; it is not an error.
//
// Results go one way: Step returns a StepOutput (who was admitted, every new subpixel, who
// finished and how), and the caller routes it to whoever asked, by request id. Requests carry no
// callbacks; the engine calls nobody.
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
// cache. Submit(), Cancel(), Waiting() and waiting() are thread-safe; Step() and the other
// accessors belong to one engine thread. Every accepted request appears exactly once in a
// StepOutput's `finished`, after its last subpixel.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "model/engine/admission.h"
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
  // Whose it is, as admissions share the cache slots (admission.h): its tenant, weight, slot
  // limit and priority. The default: one group, every request alike.
  FairShare share;
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
  // The attention implementation prefills and decode steps run (the load-time kernel check's
  // choice, engine/kernel_check.h): kAuto the kernels (on the CPU the packed step with the fused
  // kernels, on a GPU the CUDA kernels); kWindowed LibTorch ops on the model's device (the
  // windowed operator for prefills, KrauseDecodeStepLibTorch for steps; no packed step, no CUDA
  // graphs). kFusedCpu and kCuda name kAuto's choice on their device (InvalidArgument on the
  // other); nothing else is accepted.
  KrauseImpl attention_impl = KrauseImpl::kAuto;
  // The linear layers' arithmetic in the CPU's packed step, its prefills and Score
  // (model/precision.h, CpuDecoder): fp32, or bf16 through oneDNN where the CPU has AMX (else
  // fp32: precision_fallback() says why). Ignored on a GPU and with kWindowed.
  Precision precision = Precision::kFp32;
};

struct StepStats {
  int64_t admitted = 0;        // sequences prefilled this step
  int64_t prefill_tokens = 0;  // positions those prefills ran
  double prefill_seconds = 0;  // wall time of the admissions (prefills)
  double decode_seconds = 0;   // wall time of the decode step and the draws
  int64_t batch = 0;           // rows of the decode step: sequences, plus one per guided sequence
  int64_t sequences = 0;       // sequences in the decode step (each got one subpixel)
  int64_t finished = 0;        // left with OK
  int64_t cancelled = 0;       // left cancelled
  int64_t failed = 0;          // left with an error
};

// What one Step did, for the caller to route by request id.
struct StepOutput {
  struct Pixel {
    int64_t id = 0;
    int64_t index = 0;  // the subpixel's position in the image (raster order)
    uint8_t value = 0;
  };
  struct Finished {
    int64_t id = 0;
    absl::Status status;         // OK, Cancelled, or Internal (a prefill or decode step failed)
    std::vector<uint8_t> image;  // on OK: the whole image's N subpixels, prompt included
    int64_t sampled = 0;         // subpixels sampled for it (the image's length less the prompt)
  };
  std::vector<int64_t> admitted;  // requests that got their cache slots, in admission order
  std::vector<Pixel> pixels;      // every subpixel sampled, each request's in index order
  std::vector<Finished> finished;
  StepStats stats;
};

class DecodeEngine {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(const PixelModel* model,
                                                              const EngineOptions& options);

  // Validates (InvalidArgument naming the field and limit) and queues. Returns the request id.
  absl::StatusOr<int64_t> Submit(GenerationRequest request);
  // Submit's checks alone (any thread): a request that passes is accepted by Submit.
  absl::Status Validate(const GenerationRequest& request) const;
  // The request leaves at the next step with Cancelled (no effect once it has finished).
  void Cancel(int64_t id);

  // One scheduling step (engine thread): cancelled requests leave; the plan's requests still
  // waiting are admitted in the plan's order (the plan must come from PlanAdmission over
  // Waiting(), free_slots() and HeldSlots(): a request it names that no longer waits is passed
  // over, and the first that no longer fits ends the admissions); then every active sequence
  // decodes one subpixel.
  StepOutput Step(const AdmissionPlan& plan);
  // The same, admitting every waiting request that fits once the cancelled ones have left
  // (PlanAdmission without a time budget, made inside the step).
  StepOutput Step();
  // The waiting requests, oldest first, as PlanAdmission takes them.
  std::vector<WaitingRequest> Waiting() const;
  // The cache slots each share group holds (AdmissionBudget::held; engine thread).
  std::vector<GroupSlots> HeldSlots() const;
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
  // The packed CPU step (null on a GPU and with kWindowed): what Score runs in bf16.
  const CpuDecoder* cpu_decoder() const {
    return dynamic_cast<const CpuDecoder*>(packed_.cpu.get());
  }
  // The precision the linear layers run (kFp32 where bf16 was asked for but fell back) and why
  // it fell back (empty otherwise).
  Precision precision() const {
    return cpu_decoder() != nullptr ? cpu_decoder()->precision() : Precision::kFp32;
  }
  const std::string& precision_fallback() const { return precision_fallback_; }

 private:
  struct Sequence {
    int64_t id = 0;
    GenerationRequest request;
    int64_t slot = -1;
    int64_t guide_slot = -1;  // guided: the slot decoding the same pixels with the null class
    int64_t position = 0;     // model position of the next decode step
    int64_t input = 0;        // model-input token at that position
    std::vector<uint8_t> pixels;
  };

  DecodeEngine(const PixelModel* model, PixelKvCache cache, int64_t slots,
               const EngineOptions& options);
  // The decode step over the active sequences and their guide slots: logits [rows, 256] on the
  // host (host_logits_); sets *rows and guide_rows_.
  const float* RunDecodeStep(int64_t* rows);
  // Draws per parallel task: below twice this a step samples on the engine thread.
  static constexpr int64_t kSamplesPerTask = 16;
  StepOutput Run(const AdmissionPlan* plan);          // null: plan inside the step
  std::vector<WaitingRequest> WaitingLocked() const;  // under mu_
  absl::Status Admit(Sequence* s, StepOutput* out);   // prefill into a committed slot
  void Finish(Sequence* s, absl::Status status, StepOutput* out);

  const PixelModel* model_;
  at::ScalarType cache_dtype_ = at::kFloat;
  KrauseImpl forward_impl_ = KrauseImpl::kAuto;  // ForwardImpl(options.attention_impl)
  const DeviceContext device_;
  // Batch-invariant linear layers (CPU only) and the Krause layers' scales (any device).
  const PixelDecodeWeights packed_;
  std::string precision_fallback_;
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
// What an engine serving on `serving` (EngineOptions::attention_impl) reuses in every decode
// step: PackForDecode's, without the packed CPU step for kWindowed (whose steps run LibTorch ops).
// Throws as PackForDecode.
PixelDecodeWeights PackForServing(const PixelModel& model, KrauseImpl serving,
                                  Precision precision = Precision::kFp32);

// `impl`: the attention implementation of the forward (as PixelModel::Forward). `packed`: an
// engine's packed CPU step (DecodeEngine::cpu_decoder()); when it runs bf16, the images are
// scored through it (CpuDecoder::BitsPerDim: bf16 GEMMs, an image per thread) instead of
// the LibTorch forward.
absl::StatusOr<std::vector<double>> ScoreBitsPerDim(const PixelModel& model,
                                                    const at::Tensor& images,
                                                    const std::vector<int64_t>& labels = {},
                                                    KrauseImpl impl = KrauseImpl::kAuto,
                                                    const CpuDecoder* packed = nullptr);

// Steps `engine` until nothing is queued or active; every request's Finished, by id (tools,
// benchmarks and tests that want whole images).
std::map<int64_t, StepOutput::Finished> RunUntilIdle(DecodeEngine* engine);

}  // namespace krause
