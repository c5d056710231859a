#include "model/util/tensor_checks.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace krause {

std::string ShapeString(at::IntArrayRef sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes.vec(), ", "), "]");
}

std::string ExceptionMessage(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e))
    return error->what_without_backtrace();
  return e.what();
}

absl::Status CheckDefined(const at::Tensor& t, const char* name) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(name, " is undefined"));
  return absl::OkStatus();
}

absl::Status CheckRank(const at::Tensor& t, int64_t rank, const char* name, const char* layout) {
  if (t.dim() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must have shape ", layout, " (rank ",
                                                   rank, "), got ", ShapeString(t.sizes())));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const at::Tensor& t, const at::Tensor& ref, const char* name,
                            const char* ref_name) {
  if (!t.sizes().equals(ref.sizes())) {
    return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeString(t.sizes()),
                                                   " but ", ref_name, " has ",
                                                   ShapeString(ref.sizes())));
  }
  return absl::OkStatus();
}

absl::Status CheckFloating(const at::Tensor& t, const char* name) {
  if (!at::isFloatingType(t.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be a floating-point tensor, got ",
                                                   c10::toString(t.scalar_type())));
  }
  return absl::OkStatus();
}

absl::Status CheckSameTypeAndDevice(const at::Tensor& t, const at::Tensor& ref, const char* name,
                                    const char* ref_name) {
  if (t.scalar_type() != ref.scalar_type() || t.device() != ref.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " is ", c10::toString(t.scalar_type()), " on ", t.device().str(), " but ", ref_name,
        " is ", c10::toString(ref.scalar_type()), " on ", ref.device().str()));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> NormalizeLogSigma(const at::Tensor& log_sigma, int64_t heads,
                                             const at::TensorOptions& options) {
  const int64_t numel = log_sigma.numel();
  if (numel != 1 && numel != heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("log_sigma must hold 1 value (shared) or H = ", heads,
                     " values (per head), got shape ", ShapeString(log_sigma.sizes())));
  }
  if (!at::isFloatingType(log_sigma.scalar_type())) {
    return absl::InvalidArgumentError("log_sigma must be a floating-point tensor");
  }
  {
    // Checked on a host copy: on a GPU one small download (one synchronisation) instead of one
    // per check.
    at::NoGradGuard no_grad;
    const at::Tensor host = log_sigma.detach().to(at::kCPU);
    if (!at::isfinite(host).all().item<bool>()) {
      return absl::InvalidArgumentError("log_sigma must be finite (sigma = exp(log_sigma))");
    }
    // 1/sigma^2 must be a finite, non-zero number in the working dtype, or every score is
    // 0, inf or NaN.
    // (in double, rounded to the working dtype: CPU kernels for half types are not everywhere)
    const at::Tensor inv_var =
        at::exp(-2.0 * host.to(at::kDouble)).to(options.dtype().toScalarType()).to(at::kFloat);
    if (!(at::isfinite(inv_var).all().item<bool>() && (inv_var > 0).all().item<bool>())) {
      return absl::InvalidArgumentError(
          absl::StrCat("log_sigma out of range for ", c10::toString(options.dtype().toScalarType()),
                       ": 1/sigma^2 = exp(-2 log_sigma) must be finite and non-zero"));
    }
  }
  at::Tensor flat = log_sigma.reshape({numel}).to(options.device(), options.dtype());
  return numel == heads ? flat : flat.expand({heads});
}

}  // namespace krause
