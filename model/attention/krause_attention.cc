#include "model/attention/krause_attention.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <exception>

#include "absl/strings/str_cat.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {

KrauseImpl ForwardImpl(KrauseImpl serving) {
  return serving == KrauseImpl::kWindowed ? KrauseImpl::kWindowed : KrauseImpl::kAuto;
}

const char* KrauseImplName(KrauseImpl impl) {
  switch (impl) {
    case KrauseImpl::kAuto:
      return "auto";
    case KrauseImpl::kReference:
      return "reference";
    case KrauseImpl::kWindowed:
      return "windowed";
    case KrauseImpl::kFusedCpu:
      return "fused_cpu";
    case KrauseImpl::kFusedCpuTrain:
      return "fused_cpu_train";
    case KrauseImpl::kCuda:
      return "cuda";
  }
  return "unknown";
}

namespace internal {

absl::StatusOr<AttentionArgs> ValidateAttentionArgs(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v,
                                                    const at::Tensor& log_sigma,
                                                    const KrauseOptions& options) {
  RETURN_IF_ERROR(CheckDefined(q, "q"));
  RETURN_IF_ERROR(CheckDefined(k, "k"));
  RETURN_IF_ERROR(CheckDefined(v, "v"));
  RETURN_IF_ERROR(CheckDefined(log_sigma, "log_sigma"));
  RETURN_IF_ERROR(CheckRank(q, 4, "q", "[B, H, N, d]"));
  RETURN_IF_ERROR(CheckSameShape(k, q, "k", "q"));
  RETURN_IF_ERROR(CheckSameShape(v, q, "v", "q"));
  RETURN_IF_ERROR(CheckFloating(q, "q"));
  RETURN_IF_ERROR(CheckSameTypeAndDevice(k, q, "k", "q"));
  RETURN_IF_ERROR(CheckSameTypeAndDevice(v, q, "v", "q"));

  AttentionArgs a;
  a.batch = q.size(0);
  a.heads = q.size(1);
  a.n = q.size(2);
  a.head_dim = q.size(3);
  if (a.head_dim < 1) {
    return absl::InvalidArgumentError("q: head dimension d must be >= 1");
  }
  if (options.top_k < 1) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 1, got ", options.top_k));
  }
  RETURN_IF_ERROR(ValidateNeighbourhood(options.neighbourhood, a.n));
  ASSIGN_OR_RETURN(a.log_sigma, NormalizeLogSigma(log_sigma, a.heads, q.options()));
  a.q = q;
  a.k = k;
  a.v = v;
  a.kept = a.n == 0 ? 0 : std::min(options.top_k, MaxCandidates(options.neighbourhood, a.n));
  return a;
}

}  // namespace internal

absl::StatusOr<KrauseResult> KrauseAttention(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& log_sigma,
                                             const KrauseOptions& options) {
  try {
    ASSIGN_OR_RETURN(internal::AttentionArgs args,
                     internal::ValidateAttentionArgs(q, k, v, log_sigma, options));
    KrauseImpl impl = options.impl;
    const bool needs_grad =
        at::GradMode::is_enabled() &&
        (q.requires_grad() || k.requires_grad() || v.requires_grad() || log_sigma.requires_grad());
    if (impl == KrauseImpl::kAuto) {
      const bool fp32 = q.scalar_type() == at::kFloat && !needs_grad;
      impl = KrauseImpl::kWindowed;
      if (fp32 && q.device().is_cpu()) impl = KrauseImpl::kFusedCpu;
      if (needs_grad && q.scalar_type() == at::kFloat && q.device().is_cpu())
        impl = KrauseImpl::kFusedCpuTrain;
#ifdef KRAUSE_WITH_CUDA
      // Shapes the CUDA kernels do not take go to the windowed path.
      if (fp32 && q.device().is_cuda() && internal::CudaTakes(args, options).ok())
        impl = KrauseImpl::kCuda;
#endif
    }
    if (args.batch == 0 || args.heads == 0 || args.n == 0) {  // nothing to attend
      KrauseResult empty;
      empty.out = at::zeros_like(q);
      if (options.return_selection) {
        empty.indices =
            at::full({args.batch, args.heads, args.n, args.kept}, -1, q.options().dtype(at::kLong));
        empty.weights = at::zeros({args.batch, args.heads, args.n, args.kept}, q.options());
      }
      return empty;
    }
    switch (impl) {
      case KrauseImpl::kReference:
        return internal::ReferenceAttention(args, options);
      case KrauseImpl::kWindowed:
        return internal::WindowedAttention(args, options);
      case KrauseImpl::kFusedCpu:
        if (!q.device().is_cpu() || q.scalar_type() != at::kFloat) {
          return absl::InvalidArgumentError(absl::StrCat(
              "impl fused_cpu needs fp32 CPU tensors; q is ", std::string(q.toString())));
        }
        return internal::FusedCpuAttention(args, options);
      case KrauseImpl::kFusedCpuTrain:
        if (!q.device().is_cpu() || q.scalar_type() != at::kFloat) {
          return absl::InvalidArgumentError(absl::StrCat(
              "impl fused_cpu_train needs fp32 CPU tensors; q is ", std::string(q.toString())));
        }
        return internal::FusedCpuTrainAttention(args, options);
      case KrauseImpl::kCuda:
#ifdef KRAUSE_WITH_CUDA
        if (!q.device().is_cuda() || q.scalar_type() != at::kFloat) {
          return absl::InvalidArgumentError(
              absl::StrCat("impl cuda needs fp32 CUDA tensors; q is ", std::string(q.toString())));
        }
        RETURN_IF_ERROR(internal::CudaTakes(args, options));
        return internal::CudaAttention(args, options);
#else
        return absl::InvalidArgumentError(
            "impl cuda: this build has no CUDA kernels (configure with KRAUSE_WITH_CUDA=ON "
            "against a CUDA-enabled LibTorch)");
#endif
      case KrauseImpl::kAuto:
        break;
    }
    return absl::InvalidArgumentError("impl is not a known implementation");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("krause attention failed: ", ExceptionMessage(e)));
  }
}

}  // namespace krause
