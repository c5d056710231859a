#include "model/attention/cpu_kernels.h"

#include <atomic>
#include <cstring>

namespace krause::cpu {
namespace {

bool HasAvx2() {
#if defined(KRAUSE_HAVE_AVX2_KERNELS) && defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const CpuKernelTable* Best() {
#if defined(KRAUSE_HAVE_AVX2_KERNELS)
  if (HasAvx2()) return &avx2::kTable;
#endif
  return &base::kTable;
}

std::atomic<const CpuKernelTable*> g_forced{nullptr};

}  // namespace

const CpuKernelTable& CpuKernels() {
  const CpuKernelTable* forced = g_forced.load(std::memory_order_acquire);
  if (forced != nullptr) return *forced;
  static const CpuKernelTable* const best = Best();
  return *best;
}

int NumCpuKernelVariants() { return HasAvx2() ? 2 : 1; }

const char* CpuKernelVariantName(int i) { return i == 0 ? "base" : "avx2"; }

bool SetCpuKernelsForTesting(const char* name) {
  if (name == nullptr) {
    g_forced.store(nullptr, std::memory_order_release);
    return true;
  }
  if (std::strcmp(name, "base") == 0) {
    g_forced.store(&base::kTable, std::memory_order_release);
    return true;
  }
#if defined(KRAUSE_HAVE_AVX2_KERNELS)
  if (std::strcmp(name, "avx2") == 0 && HasAvx2()) {
    g_forced.store(&avx2::kTable, std::memory_order_release);
    return true;
  }
#endif
  return false;
}

int64_t ScratchFloats(int64_t max_candidates) {
  return kQueryGroup * RoundUpToChunk(max_candidates + kQueryGroup);
}

}  // namespace krause::cpu
