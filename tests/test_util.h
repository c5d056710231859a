// Shared helpers for the tests: Status matchers, deterministic input families and error metrics.
#pragma once

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace krause::testing {

// EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")))
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = arg;
  if (s.code() != code) {
    *result_listener << "code is " << absl::StatusCodeToString(s.code()) << ": " << s.message();
    return false;
  }
  return ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }

#define KRAUSE_ASSERT_OK_AND_ASSIGN(lhs, expr)                 \
  auto KRAUSE_CONCAT_T_(sor_, __LINE__) = (expr);              \
  ASSERT_TRUE(KRAUSE_CONCAT_T_(sor_, __LINE__).ok())           \
      << KRAUSE_CONCAT_T_(sor_, __LINE__).status().ToString(); \
  lhs = std::move(KRAUSE_CONCAT_T_(sor_, __LINE__)).value()
#define KRAUSE_CONCAT_T_(a, b) KRAUSE_CONCAT_T2_(a, b)
#define KRAUSE_CONCAT_T2_(a, b) a##b

// GPU tests skip without a CUDA device, unless KRAUSE_REQUIRE_CUDA is set (the device check sets
// it, so that a machine whose GPU LibTorch cannot see fails instead of passing on skips).
#define KRAUSE_SKIP_WITHOUT_CUDA()                                               \
  do {                                                                           \
    if (!at::hasCUDA()) {                                                        \
      if (std::getenv("KRAUSE_REQUIRE_CUDA") != nullptr) {                       \
        FAIL() << "KRAUSE_REQUIRE_CUDA is set but LibTorch sees no CUDA device"; \
      }                                                                          \
      GTEST_SKIP() << "no CUDA device";                                          \
    }                                                                            \
  } while (0)

// Values that are multiples of 1/4 in [-0.5, 0.5], times 2^scale_log2. Dot products and squared
// norms of such vectors are exact in fp32 (d <= 64), so every implementation ranks candidates
// identically and exact ties really are ties: the tie rule is exercised, not rounding.
inline at::Tensor QuantizedTensor(at::IntArrayRef shape, int scale_log2, at::Generator& gen) {
  at::Tensor u = at::randint(-2, 3, shape, gen, at::kFloat);  // {-2..2}
  return u * std::ldexp(0.25f, scale_log2);
}

inline at::Tensor GaussianTensor(at::IntArrayRef shape, double stddev, at::Generator& gen) {
  return at::normal(0.0, stddev, shape, gen).to(at::kFloat);
}

// max |x - ref| / max |ref|: the error relative to the output scale.
inline double RelativeMaxError(const at::Tensor& x, const at::Tensor& ref) {
  const double scale = ref.abs().max().item<double>();
  const double err = (x.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
  return scale > 0 ? err / scale : err;
}

}  // namespace krause::testing
