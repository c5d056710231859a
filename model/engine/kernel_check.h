// The load-time kernel check: before a model serves, the path it would serve on runs on a small
// deterministic input at the model's own shapes and is compared with the plain reference (the
// reference operator in LibTorch ops, on the CPU). The server (server/core/registry.cc) tries the
// implementations of ServingChain in order and serves the first that passes; it never serves one
// that failed.
//
//   classifier  four images (noise, blank, a gradient, blocks: the blank one is all ties) through
//               the serving forward (the packed CpuViT, or ViT::Forward with the implementation
//               on the model's device), softmax probabilities against ViT::Forward(kReference).
//   generator   two sequences in two cache slots (a conditional model: one with class 0, one with
//               the null class) as the engine runs them: a prefill of each (7 and 1 positions),
//               then batched decode steps at different positions, past the end of the ring
//               (W + 24 positions in all, at most the image), then the longer one alone; every
//               position's logits against the teacher-forced ForwardTokens(kReference).
//
// Tolerances (absolute): probabilities 1e-4 (2e-2 in the bf16 precision, whose activations are
// rounded to bfloat16 before every linear layer: model/precision.h); logits 2e-3 with fp32 caches
// and 0.25 with bf16 / fp16 caches (their keys and values are rounded; the reference's are not)
// or in the bf16 precision (activations rounded before every linear layer). A
// model served with bfloat16 linear weights (ParameterStore::RoundLinear) is checked at the same
// tolerances: its reference computes with the same rounded weights. A non-finite value, a
// difference over the tolerance or an error (a Status, an exception) fails the check; its
// KernelCheck says which, how much and where.
//
// The check doubles as warm-up: it packs the weights, runs every kernel of the serving path and
// (on a GPU) loads them. What stays lazy is documented in docs/serving.md.
// Thread-safety: free functions; the models are only read.
#pragma once

#include <ATen/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/attention/krause_attention.h"
#include "model/loader.h"
#include "model/pixel_model.h"
#include "model/precision.h"
#include "model/vit.h"

namespace krause {

// One way to serve a model: on which device, with which implementation (kCuda: the CUDA kernels;
// kFusedCpu: the packed CPU forward / decode step with the fused kernels; kWindowed: LibTorch
// ops, the windowed operator and KrauseDecodeStepLibTorch).
struct ServingChoice {
  std::string device;  // "cpu", "cuda", "cuda:N"
  KrauseImpl impl = KrauseImpl::kFusedCpu;
  bool operator==(const ServingChoice& o) const { return device == o.device && impl == o.impl; }
};

// The implementations to try, in order, for a model configured for `device`:
//   cpu     fused_cpu, windowed
//   cuda:N  cuda, windowed (on cuda:N), then fused_cpu, windowed on the cpu
// `forced` (a model's attention_impl; kAuto for none) leaves only that implementation, on
// `device`. InvalidArgument for an implementation that cannot serve there (cuda on the CPU,
// fused_cpu on a GPU) or that is not a serving implementation (reference, fused_cpu_train).
absl::StatusOr<std::vector<ServingChoice>> ServingChain(const std::string& device,
                                                        KrauseImpl forced);

// The implementations a model may be served on, by name (a manifest's "attention_impl"; "auto"
// lets the kernel check choose among the others). The one list: the server's manifest checks
// and ParseServingImpl read it.
inline constexpr const char* kServingImplNames[] = {"auto", "cuda", "fused_cpu", "windowed"};
// Parses a serving implementation's name (kServingImplNames). InvalidArgument naming the accepted
// ones otherwise.
absl::StatusOr<KrauseImpl> ParseServingImpl(const std::string& name);

enum class CheckOutcome { kPassed, kMismatch, kNonFinite, kError, kUnchecked };
// "passed", "mismatch", "non_finite", "error", "unchecked" (the check was off).
const char* CheckOutcomeName(CheckOutcome outcome);

struct KernelCheck {
  ServingChoice choice;
  CheckOutcome outcome = CheckOutcome::kUnchecked;
  double max_abs_diff = 0;  // the worst |serving - reference| (0 for an error or unchecked)
  double tolerance = 0;
  // kMismatch: where the worst difference is ("image 1, class 7"; "sequence 0, position 60,
  // logit 13"); kNonFinite: the first non-finite value; kError: the error's message.
  std::string where;
  int64_t compared = 0;  // values compared
  double seconds = 0;    // the check's wall time, reference included
  // The precision the serving path ran (a classifier's packed forward asked for bf16 runs fp32
  // where the CPU has no AMX).
  Precision precision = Precision::kFp32;

  bool passed() const { return outcome == CheckOutcome::kPassed; }
  // One line: "fused_cpu on cpu passed: max |diff| 3.0e-08 <= 1e-04 over 40 values in 2.1 ms"
  // ("fused_cpu bf16 on cpu ..." for the bf16 precision).
  std::string Summary() const;
};

// `model`: on choice.device; `reference`: the same weights on the CPU (the same object when the
// model is on the CPU).
// `precision`: the packed forward's (fused_cpu; the other implementations compute in fp32).
KernelCheck CheckClassifier(const ViT& model, const ViT& reference, const ServingChoice& choice,
                            Precision precision = Precision::kFp32);
// `cache_dtype`: the KV cache's (EngineOptions::cache_dtype); `precision`: the packed CPU
// step's (EngineOptions::precision).
KernelCheck CheckGenerator(const PixelModel& model, const PixelModel& reference,
                           const ServingChoice& choice, at::ScalarType cache_dtype = at::kFloat,
                           Precision precision = Precision::kFp32);
// Whichever of the two `model` holds: `model` loaded on choice.device, `reference` the same
// checkpoint on the CPU. A KARM's rings are `gpu_cache_dtype` on a GPU and
// CpuCacheDtype(gpu_cache_dtype) on the CPU, as the engine would make them there; an ARM's cache
// is checked in fp32 (its engine refuses any other).
// `precision`: the packed CPU path's (CpuViT or CpuDecoder).
KernelCheck CheckLoadedModel(const LoadedModel& model, const LoadedModel& reference,
                             const ServingChoice& choice, at::ScalarType gpu_cache_dtype,
                             Precision precision = Precision::kFp32);
// The ring cache dtype a generator configured with `requested` gets on the CPU (its device, or
// the fallback of a GPU model): CPU rings are fp32 or bf16, so fp16 (GPU only) becomes fp32.
at::ScalarType CpuCacheDtype(at::ScalarType requested);

}  // namespace krause
