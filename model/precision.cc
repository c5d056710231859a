#include "model/precision.h"

#include "absl/strings/str_cat.h"

namespace krause {

const char* PrecisionName(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

absl::StatusOr<Precision> ParsePrecision(const std::string& name, const std::string& what) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be fp32 or bf16, got \"", name, "\""));
}

}  // namespace krause
