// Linked into every GoogleTest binary (krause_add_test): each test starts LibTorch's default
// generators from one fixed seed. LibTorch seeds its default CPU generator nondeterministically,
// so a test that draws from it (at::randn or at::randint without a generator) saw other inputs
// on every run, and a test whose tolerance a rare draw exceeds failed now and then (one in about
// sixty runs of a CpuDecoderTest case: random LayerNorm weights whose top-k had a near-tie that
// the FMA and non-FMA kernels broke differently). Seeding at each test's start, not once per
// process, gives a test the same inputs whether ctest runs it alone or the binary runs them all.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>

namespace {

constexpr uint64_t kTestSeed = 20261202;

class SeedEachTest : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override { at::manual_seed(kTestSeed); }
};

// Registered during static initialisation, before gtest_main runs the tests.
const bool kRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedEachTest);
  return true;
}();

}  // namespace
