#include "model/util/threads.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace krause {
namespace {

TEST(CpuThreads, SetsIntraOpThreadsAndSingleThreadedBlas) {
  ASSERT_EQ(unsetenv("OPENBLAS_NUM_THREADS"), 0);
  SetBlasThreads(2);
  const CpuThreads t = SetCpuThreads(2);
  EXPECT_EQ(t.intra_op, 2);
  EXPECT_EQ(at::get_num_threads(), 2);
  EXPECT_FALSE(t.blas_from_env);
  if (t.blas == 0) GTEST_SKIP() << "OpenBLAS is not the BLAS LibTorch loaded here";
  EXPECT_EQ(t.blas, 1);
  EXPECT_EQ(BlasThreads(), 1);
}

TEST(CpuThreads, ZeroMeansOnePerCore) {
  const CpuThreads t = SetCpuThreads(0);
  EXPECT_GE(t.intra_op, 1);
}

TEST(CpuThreads, RespectsOpenBlasEnvironment) {
  ASSERT_EQ(setenv("OPENBLAS_NUM_THREADS", "2", 1), 0);
  SetBlasThreads(2);
  const CpuThreads t = SetCpuThreads(1);
  unsetenv("OPENBLAS_NUM_THREADS");
  EXPECT_TRUE(t.blas_from_env);
  if (t.blas == 0) GTEST_SKIP() << "OpenBLAS is not the BLAS LibTorch loaded here";
  EXPECT_EQ(t.blas, 2);  // left as the user asked
}

}  // namespace
}  // namespace krause
