#include "model/engine/kernel_check.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/engine/decode_engine.h"
#include "model/kv_cache.h"
#include "model/util/tensor_checks.h"
#include "model/vit_cpu.h"

namespace krause {
namespace {

constexpr double kProbabilityTolerance = 1e-4;
// The bf16 precision's classifiers: activations rounded to bfloat16 before every linear layer
// (about 3 significant digits), so probabilities move by up to a few thousandths.
constexpr double kBf16ProbabilityTolerance = 2e-2;
constexpr double kLogitTolerance = 2e-3;
constexpr double kHalfCacheLogitTolerance = 0.25;

// A small linear congruential generator: the same inputs on every machine and LibTorch version.
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  uint32_t Next() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(state_ >> 33);
  }

 private:
  uint64_t state_;
};

bool IsCpu(const std::string& device) { return at::Device(device).is_cpu(); }

// Compares serving with reference (same shape, CPU fp32) into `check`; `where(i)` names flat
// index i.
template <typename Where>
void Compare(const at::Tensor& serving, const at::Tensor& reference, double tolerance,
             const Where& where, KernelCheck* check) {
  const at::Tensor s = serving.to(at::kCPU, at::kFloat).contiguous().view(-1);
  const at::Tensor r = reference.to(at::kCPU, at::kFloat).contiguous().view(-1);
  check->tolerance = tolerance;
  check->compared = s.numel();
  if (s.numel() != r.numel()) {
    check->outcome = CheckOutcome::kError;
    check->where =
        absl::StrCat("the serving path gave ", s.numel(), " values, the reference ", r.numel());
    return;
  }
  const at::Tensor finite = at::isfinite(s);
  if (!finite.all().item<bool>()) {
    const int64_t i = at::argmin(finite.to(at::kInt)).item<int64_t>();
    check->outcome = CheckOutcome::kNonFinite;
    check->where = absl::StrCat(where(i), " is ", s[i].item<float>());
    return;
  }
  const at::Tensor diff = (s - r).abs();
  const int64_t i = at::argmax(diff).item<int64_t>();
  check->max_abs_diff = diff[i].item<double>();
  check->where = where(i);
  check->outcome =
      check->max_abs_diff <= tolerance ? CheckOutcome::kPassed : CheckOutcome::kMismatch;
}

// Runs `body` (which fills `check`), timing it and turning errors into kError.
template <typename Body>
KernelCheck Run(const ServingChoice& choice, const Body& body) {
  KernelCheck check;
  check.choice = choice;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const c10::InferenceMode inference;
    if (absl::Status st = body(&check); !st.ok()) {
      check.outcome = CheckOutcome::kError;
      check.max_abs_diff = 0;
      check.where = std::string(st.message());
    }
  } catch (const std::exception& e) {
    check.outcome = CheckOutcome::kError;
    check.max_abs_diff = 0;
    check.where = ExceptionMessage(e);
  }
  check.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return check;
}

// Four images [4, C, S, S] uint8: noise, blank (every score ties), a gradient, blocks.
at::Tensor CheckImages(const ViTConfig& c) {
  const int64_t n = c.channels * c.image_size * c.image_size;
  at::Tensor images = at::empty({4, c.channels, c.image_size, c.image_size}, at::kByte);
  uint8_t* p = images.data_ptr<uint8_t>();
  Lcg rng(20261204);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x = i % c.image_size, y = (i / c.image_size) % c.image_size;
    p[i] = static_cast<uint8_t>(rng.Next() & 255);
    p[n + i] = 0;
    p[2 * n + i] = static_cast<uint8_t>(255 * x / std::max<int64_t>(1, c.image_size - 1));
    p[3 * n + i] = ((x / c.patch + y / c.patch) % 2) != 0 ? 255 : 0;
  }
  return images;
}

}  // namespace

absl::StatusOr<KrauseImpl> ParseServingImpl(const std::string& name) {
  const bool serving = std::find(std::begin(kServingImplNames), std::end(kServingImplNames),
                                 name) != std::end(kServingImplNames);
  for (KrauseImpl impl : {KrauseImpl::kAuto, KrauseImpl::kReference, KrauseImpl::kWindowed,
                          KrauseImpl::kFusedCpu, KrauseImpl::kCuda, KrauseImpl::kFusedCpuTrain}) {
    if (serving && name == KrauseImplName(impl)) return impl;
  }
  return absl::InvalidArgumentError(absl::StrCat("attention_impl \"", name, "\" is not one of ",
                                                 absl::StrJoin(kServingImplNames, ", ")));
}

absl::StatusOr<std::vector<ServingChoice>> ServingChain(const std::string& device,
                                                        KrauseImpl forced) {
  const bool cpu = IsCpu(device);
  std::vector<ServingChoice> chain;
  if (cpu) {
    chain = {{device, KrauseImpl::kFusedCpu}, {device, KrauseImpl::kWindowed}};
  } else {
    chain = {{device, KrauseImpl::kCuda},
             {device, KrauseImpl::kWindowed},
             {"cpu", KrauseImpl::kFusedCpu},
             {"cpu", KrauseImpl::kWindowed}};
  }
  if (forced == KrauseImpl::kAuto) return chain;
  for (const ServingChoice& c : chain)
    if (c.device == device && c.impl == forced) return std::vector<ServingChoice>{c};
  return absl::InvalidArgumentError(
      absl::StrCat("attention_impl ", KrauseImplName(forced), " cannot serve a model on ", device,
                   " (auto, windowed, or ", cpu ? "fused_cpu" : "cuda", ")"));
}

const char* CheckOutcomeName(CheckOutcome outcome) {
  switch (outcome) {
    case CheckOutcome::kPassed:
      return "passed";
    case CheckOutcome::kMismatch:
      return "mismatch";
    case CheckOutcome::kNonFinite:
      return "non_finite";
    case CheckOutcome::kError:
      return "error";
    case CheckOutcome::kUnchecked:
      break;
  }
  return "unchecked";
}

std::string KernelCheck::Summary() const {
  std::string s =
      absl::StrCat(KrauseImplName(choice.impl), precision == Precision::kBf16 ? " bf16" : "",
                   " on ", choice.device, " ", CheckOutcomeName(outcome));
  switch (outcome) {
    case CheckOutcome::kPassed:
      absl::StrAppendFormat(&s, ": max |diff| %.1e <= %.0e over %d values", max_abs_diff, tolerance,
                            compared);
      break;
    case CheckOutcome::kMismatch:
      absl::StrAppendFormat(&s, ": max |diff| %.3g > %.0e at %s", max_abs_diff, tolerance, where);
      break;
    case CheckOutcome::kNonFinite:
    case CheckOutcome::kError:
      absl::StrAppend(&s, ": ", where);
      break;
    case CheckOutcome::kUnchecked:
      return s + " (--kernel_check=off)";
  }
  absl::StrAppendFormat(&s, " in %.1f ms", seconds * 1e3);
  return s;
}

KernelCheck CheckClassifier(const ViT& model, const ViT& reference, const ServingChoice& choice,
                            Precision precision) {
  return Run(choice, [&](KernelCheck* check) -> absl::Status {
    const ViTConfig& c = reference.config();
    const at::Tensor images = CheckImages(c);
    const int64_t b = images.size(0);
    at::Tensor probs;
    double tolerance = kProbabilityTolerance;
    if (choice.impl == KrauseImpl::kFusedCpu) {
      auto packed = CpuViT::Create(model, precision);
      if (!packed.ok()) return packed.status();
      check->precision = (*packed)->precision();
      if (check->precision == Precision::kBf16) tolerance = kBf16ProbabilityTolerance;
      probs = at::empty({b, (*packed)->classes()}, at::kFloat);
      if (absl::Status st =
              (*packed)->Forward(images.data_ptr<uint8_t>(), b, probs.data_ptr<float>());
          !st.ok())
        return st;
    } else {
      const at::Tensor x = NormalizePixels(c, images.to(at::Device(choice.device)));
      probs = at::softmax(model.Forward(x, ForwardImpl(choice.impl)), -1).to(at::kCPU);
    }
    const at::Tensor want =
        at::softmax(reference.Forward(NormalizePixels(c, images), KrauseImpl::kReference), -1);
    const int64_t classes = want.size(-1);
    Compare(
        probs, want, tolerance,
        [&](int64_t i) { return absl::StrCat("image ", i / classes, ", class ", i % classes); },
        check);
    return absl::OkStatus();
  });
}

KernelCheck CheckGenerator(const PixelModel& model, const PixelModel& reference,
                           const ServingChoice& choice, at::ScalarType cache_dtype,
                           Precision precision) {
  return Run(choice, [&](KernelCheck* check) -> absl::Status {
    const PixelModelConfig& c = reference.config();
    const int64_t n = c.seq_len();
    const int64_t ring = c.attention == AttentionKind::kKrause ? c.window : 32;
    const int64_t length = std::min(n, ring + 24);  // positions per sequence
    const int64_t prefill[2] = {std::min<int64_t>(7, length - 1), 1};
    // Model inputs u [2, length]: a start token (start-token models), then pseudo-random pixels.
    at::Tensor u = at::empty({2, length}, at::kLong);
    auto ua = u.accessor<int64_t, 2>();
    Lcg rng(7);
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t p = 0; p < length; ++p)
        ua[s][p] = (p == 0 && c.start_token) ? PixelModel::kStartToken
                                             : static_cast<int64_t>(rng.Next() & 255);
    // Conditional models: sequence 0 with class 0, sequence 1 with the null class.
    at::Tensor classes;
    if (c.conditional()) classes = at::tensor(std::vector<int64_t>{0, c.null_class()}, at::kLong);

    // The serving path, as the engine runs it.
    const at::Device dev(choice.device);
    auto cache = PixelKvCache::Create(c, 2, dev, cache_dtype);
    if (!cache.ok()) return cache.status();
    if (absl::Status st = cache->SetDecodeImpl(ForwardImpl(choice.impl)); !st.ok()) return st;
    const PixelDecodeWeights packed = PackForServing(model, choice.impl, precision);
    if (const auto* cpu = dynamic_cast<const CpuDecoder*>(packed.cpu.get()); cpu != nullptr)
      check->precision = cpu->precision();
    at::Tensor logits = at::zeros({2, length, 256}, at::kFloat);
    for (int64_t s = 0; s < 2; ++s) {
      if (c.conditional()) cache->SetClass(s, s == 0 ? 0 : c.null_class());
      logits[s]
          .narrow(0, 0, prefill[s])
          .copy_(model
                     .Prefill(u[s].narrow(0, 0, prefill[s]), s, &*cache, ForwardImpl(choice.impl),
                              &packed)
                     .to(at::kCPU));
    }
    int64_t position[2] = {prefill[0], prefill[1]};
    while (position[0] < length || position[1] < length) {
      std::vector<int64_t> rows, tokens, positions;
      for (int64_t s = 0; s < 2; ++s) {
        if (position[s] >= length) continue;
        rows.push_back(s);
        tokens.push_back(ua[s][position[s]]);
        positions.push_back(position[s]);
      }
      const at::Tensor out =
          model
              .DecodeStep(at::tensor(tokens, at::kLong), at::tensor(positions, at::kLong),
                          at::tensor(rows, at::kLong), &*cache, &packed)
              .to(at::kCPU);
      for (size_t i = 0; i < rows.size(); ++i)
        logits[rows[i]][position[rows[i]]++].copy_(out[static_cast<int64_t>(i)]);
    }
    const at::Tensor want = reference.ForwardTokens(u, KrauseImpl::kReference, nullptr, classes);
    const double tolerance = cache_dtype == at::kFloat && check->precision == Precision::kFp32
                                 ? kLogitTolerance
                                 : kHalfCacheLogitTolerance;
    Compare(
        logits, want, tolerance,
        [&](int64_t i) {
          return absl::StrCat("sequence ", i / (length * 256), ", position ", (i / 256) % length,
                              ", logit ", i % 256);
        },
        check);
    return absl::OkStatus();
  });
}

KernelCheck CheckLoadedModel(const LoadedModel& model, const LoadedModel& reference,
                             const ServingChoice& choice, at::ScalarType gpu_cache_dtype,
                             Precision precision) {
  if (model.classifier()) return CheckClassifier(*model.vit, *reference.vit, choice, precision);
  // An ARM's cache is fp32 (a reduced one is refused when its engine is made, naming the model).
  const bool rings = model.pixel->config().attention == AttentionKind::kKrause;
  const at::ScalarType cache = !rings                 ? at::kFloat
                               : IsCpu(choice.device) ? CpuCacheDtype(gpu_cache_dtype)
                                                      : gpu_cache_dtype;
  return CheckGenerator(*model.pixel, *reference.pixel, choice, cache, precision);
}

at::ScalarType CpuCacheDtype(at::ScalarType requested) {
  return requested == at::kHalf ? at::kFloat : requested;
}

}  // namespace krause
