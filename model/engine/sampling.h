// Sampling one subpixel from 256 logits: temperature, top-k, top-p (nucleus) or greedy, driven
// by a counter-based random stream: the draw for pixel i of a request depends only on (seed, i),
// so a request gives the same image alone or batched with any others, joining at any step.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace krause {

struct SamplingParams {
  double temperature = 1.0;  // > 0; 0 means greedy (argmax, lowest value on ties)
  double top_p = 1.0;        // (0, 1]: keep the smallest most-likely set with mass >= top_p
  int64_t top_k = 0;         // 0: off; else 1..256: keep the k most likely values
  uint64_t seed = 0;
};

// InvalidArgument naming the field and its limits.
absl::Status ValidateSampling(const SamplingParams& p);

// 64 random bits from (seed, counter): SplitMix64 of a mix of both.
uint64_t CounterBits(uint64_t seed, uint64_t counter);
// A uniform double in [0, 1) from (seed, counter): the top 53 of CounterBits.
double CounterUniform(uint64_t seed, uint64_t counter);

// Classifier-free guidance: out[v] = unconditional[v] + guidance * (conditional[v] -
// unconditional[v]) for the 256 values (out may alias neither input).
void GuideLogits(const float* conditional, const float* unconditional, double guidance, float* out);

// Samples from logits[0..255] (fp32, finite) for pixel `index` of a request: the values ranked
// by logit (equal logits: the lower value first), then greedy, or top-k, top-p and a draw from
// the kept mass in rank order with CounterUniform(seed, index).
uint8_t SamplePixel(const float* logits, const SamplingParams& p, uint64_t index);
// The same with the ranking written plainly (a stable sort by logit): the reference SamplePixel
// is tested against, value for value.
uint8_t SamplePixelReference(const float* logits, const SamplingParams& p, uint64_t index);

}  // namespace krause
