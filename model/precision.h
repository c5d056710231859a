// The arithmetic a model is served with (a manifest's or config.json's "precision"):
//   fp32  every product and sum in fp32 through the packed kernels (cpu_kernels.h): the same bits
//         on every CPU with the same kernel variant, batch-invariant; the default.
//   bf16  the linear layers' GEMMs take bfloat16 weights (rounded once at load) and bfloat16
//         activations (rounded per call) and accumulate in fp32, through oneDNN (nn/dnnl_linear.h:
//         AMX or AVX512-BF16); attention, its Krause selection, norms and GELU stay fp32 and
//         exact. Batch-invariant on a given CPU; CPUs without AMX fall back to fp32 (the model says
//         so: oneDNN's AVX512-BF16 kernels measured slower than the fp32 kernels).
// Thread-safety: constants and pure functions.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace krause {

enum class Precision { kFp32 = 0, kBf16 = 1 };

// "fp32" or "bf16".
const char* PrecisionName(Precision p);
// InvalidArgument "`what` must be fp32 or bf16, got \"NAME\"" for any other name.
absl::StatusOr<Precision> ParsePrecision(const std::string& name, const std::string& what);

}  // namespace krause
