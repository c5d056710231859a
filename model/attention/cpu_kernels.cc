#include "model/attention/cpu_kernels.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

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

bool HasAvx512() {
#if defined(KRAUSE_HAVE_AVX512_KERNELS) && defined(__x86_64__)
  __builtin_cpu_init();
  return HasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

const CpuKernelTable* Best() {
#if defined(KRAUSE_HAVE_AVX512_KERNELS)
  if (HasAvx512()) return &avx512::kTable;
#endif
#if defined(KRAUSE_HAVE_AVX2_KERNELS)
  if (HasAvx2()) return &avx2::kTable;
#endif
  return &base::kTable;
}

std::atomic<const CpuKernelTable*> g_forced{nullptr};

const CpuKernelTable* Variant(const char* name) {
  if (std::strcmp(name, "base") == 0) return &base::kTable;
#if defined(KRAUSE_HAVE_AVX2_KERNELS)
  if (std::strcmp(name, "avx2") == 0 && HasAvx2()) return &avx2::kTable;
#endif
#if defined(KRAUSE_HAVE_AVX512_KERNELS)
  if (std::strcmp(name, "avx512") == 0 && HasAvx512()) return &avx512::kTable;
#endif
  return nullptr;
}

// The process's choice: KRAUSE_CPU_KERNELS's variant when it names one this CPU runs, else the
// best (and the reason in *error).
const CpuKernelTable* Chosen(std::string* error) {
  const char* env = std::getenv("KRAUSE_CPU_KERNELS");
  if (env == nullptr || *env == '\0') return Best();
  if (const CpuKernelTable* t = Variant(env)) return t;
  *error = std::string("KRAUSE_CPU_KERNELS=") + env + " is not a variant this build and CPU run (";
  for (int i = 0; i < NumCpuKernelVariants(); ++i)
    *error += std::string(i > 0 ? ", " : "") + CpuKernelVariantName(i);
  *error += ")";
  return Best();
}

struct Choice {
  std::string error;
  const CpuKernelTable* table = Chosen(&error);
};
const Choice& TheChoice() {
  static const Choice choice;
  return choice;
}

// The fault tables (SetCpuKernelsForTesting "fault_values" / "fault_throw"): the best variant
// with its Krause prefill and decode kernels broken, everything else (linear rows, GELU, the
// softmax kernels) intact.
void PrefillWrongValues(const PrefillSlice& slice, int64_t q0, int64_t q1, const Scratch& s) {
  Best()->prefill(slice, q0, q1, s);
  for (int64_t i = q0; i < q1; ++i) slice.out[i * slice.d] += 0.5f;
}
void DecodeWrongValues(const DecodeItem& item, const Scratch& s) {
  Best()->decode(item, s);
  item.out[0] += 0.5f;
}
[[noreturn]] void Throw() {
  throw std::runtime_error(
      "a fault injected into the fused Krause kernels (SetCpuKernelsForTesting)");
}
void PrefillThrows(const PrefillSlice&, int64_t, int64_t, const Scratch&) { Throw(); }
void DecodeThrows(const DecodeItem&, const Scratch&) { Throw(); }

CpuKernelTable Faulty(const char* name, decltype(CpuKernelTable::prefill) prefill,
                      decltype(CpuKernelTable::decode) decode) {
  CpuKernelTable t = *Best();
  t.name = name;
  t.prefill = prefill;
  t.decode = decode;
  return t;
}

}  // namespace

const CpuKernelTable& CpuKernels() {
  const CpuKernelTable* forced = g_forced.load(std::memory_order_acquire);
  if (forced != nullptr) return *forced;
  return *TheChoice().table;
}

const char* CpuKernelsChoiceError() { return TheChoice().error.c_str(); }

int NumCpuKernelVariants() { return HasAvx512() ? 3 : HasAvx2() ? 2 : 1; }

const char* CpuKernelVariantName(int i) {
  static const char* const kNames[] = {"base", "avx2", "avx512"};
  return i >= 0 && i < 3 ? kNames[i] : "";
}

const char* CpuKernelFamily(const char* variant) {
  return std::strcmp(variant, "avx512") == 0 ? "avx2" : variant;
}

bool SetCpuKernelsForTesting(const char* name) {
  if (name == nullptr) {
    g_forced.store(nullptr, std::memory_order_release);
    return true;
  }
  if (std::strcmp(name, "fault_values") == 0) {
    static const CpuKernelTable t = Faulty("fault_values", &PrefillWrongValues, &DecodeWrongValues);
    g_forced.store(&t, std::memory_order_release);
    return true;
  }
  if (std::strcmp(name, "fault_throw") == 0) {
    static const CpuKernelTable t = Faulty("fault_throw", &PrefillThrows, &DecodeThrows);
    g_forced.store(&t, std::memory_order_release);
    return true;
  }
  if (const CpuKernelTable* t = Variant(name)) {
    g_forced.store(t, std::memory_order_release);
    return true;
  }
  return false;
}

int64_t ScratchFloats(int64_t max_candidates) {
  return kQueryGroup * RoundUpToChunk(max_candidates + kQueryGroup);
}

}  // namespace krause::cpu
