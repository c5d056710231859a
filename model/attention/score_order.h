// The order in which every implementation ranks scores (krause_attention.h), as a uint32 key for
// radix selection on the CPU and the GPU: unsigned comparison of keys is comparison of scores,
// with two rules for the edge values that IEEE comparison leaves open:
//  - -0 and +0 are the same score (so their tie goes to the larger key index, like any tie);
//  - every NaN ranks above every number, +inf included, and all NaNs are one score (a NaN key is
//    a tie with another NaN, whatever the sign and payload). This is LibTorch's sort order, so
//    the reference and windowed paths rank the same way.
// Real scores map into [0x007fffff (-inf), 0xff800000 (+inf)]: the key 0 is never a score's, and
// NaN is 0xffffffff.
// Plain C++ without any library: compiled by the host compiler and by nvcc (the CUDA kernels).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KRAUSE_HOST_DEVICE __host__ __device__
#else
#define KRAUSE_HOST_DEVICE
#endif

namespace krause {

// The key of a score given its IEEE-754 bits. Internal linkage: the CPU kernels' ISA variants
// (cpu_kernels_*.cc, built with different -m flags) must each keep their own copy.
KRAUSE_HOST_DEVICE static inline uint32_t ScoreKey(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN
  if (bits == 0x80000000u) bits = 0;                           // -0 is +0
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

}  // namespace krause
