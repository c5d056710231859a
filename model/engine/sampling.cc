#include "model/engine/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace krause {

absl::Status ValidateSampling(const SamplingParams& p) {
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature) || p.temperature > 100.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be in [0, 100] (0 = greedy), got ", p.temperature));
  }
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  if (p.top_k < 0 || p.top_k > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be in [0, 256] (0 = off), got ", p.top_k));
  }
  return absl::OkStatus();
}

uint64_t CounterBits(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (counter + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double CounterUniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(CounterBits(seed, counter) >> 11) *
         (1.0 / 9007199254740992.0);  // 53 bits
}

namespace {

// Draws from the 256 values in `order` (most likely first, equal logits: the lower value first).
uint8_t SampleInOrder(const float* logits, const std::array<int, 256>& order,
                      const SamplingParams& p, uint64_t index) {
  const int keep_k = p.top_k > 0 ? static_cast<int>(p.top_k) : 256;
  std::array<double, 256> prob;
  const double max_logit = logits[order[0]];
  double total = 0;
  for (int i = 0; i < keep_k; ++i) {
    prob[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) / p.temperature);
    total += prob[i];
  }
  int keep = keep_k;
  if (p.top_p < 1.0) {
    double mass = 0;
    for (int i = 0; i < keep_k; ++i) {
      mass += prob[i] / total;
      if (mass >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_total = 0;
  for (int i = 0; i < keep; ++i) kept_total += prob[i];
  const double u = CounterUniform(p.seed, index) * kept_total;
  double acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += prob[i];
    if (u < acc) return static_cast<uint8_t>(order[i]);
  }
  return static_cast<uint8_t>(order[keep - 1]);
}

}  // namespace

uint8_t SamplePixelReference(const float* logits, const SamplingParams& p, uint64_t index) {
  std::array<int, 256> order;
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; equal logits: the lower value first (deterministic).
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  if (p.temperature == 0.0) return static_cast<uint8_t>(order[0]);
  return SampleInOrder(logits, order, p, index);
}

uint8_t SamplePixel(const float* logits, const SamplingParams& p, uint64_t index) {
  if (p.temperature == 0.0) {  // the first of the largest
    int best = 0;
    for (int i = 1; i < 256; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<uint8_t>(best);
  }
  // The reference's order by sorting 64-bit keys: the logit's bits mapped so that a larger logit
  // gives a smaller key (-0 counted as +0, as the comparison does), then the value.
  std::array<uint64_t, 256> key;
  for (int i = 0; i < 256; ++i) {
    const float f = logits[i] == 0.0f ? 0.0f : logits[i];
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
    key[i] = (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint64_t>(i);
  }
  std::sort(key.begin(), key.end());
  std::array<int, 256> order;
  for (int i = 0; i < 256; ++i) order[i] = static_cast<int>(key[i] & 0xff);
  return SampleInOrder(logits, order, p, index);
}

void GuideLogits(const float* conditional, const float* unconditional, double guidance,
                 float* out) {
  const float g = static_cast<float>(guidance);
  for (int v = 0; v < 256; ++v) out[v] = unconditional[v] + g * (conditional[v] - unconditional[v]);
}

}  // namespace krause
