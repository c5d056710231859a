// Causal softmax attention: the ARM baseline's attention (out_i = sum over j <= i of
// softmax_j(q_i . k_j / sqrt(d)) v_j), with two implementations:
//   reference: LibTorch ops (matmul, an upper-triangle mask, softmax, matmul), differentiable
//     through autograd; any dtype and device;
//   fused CPU training path: one kernel per (batch, head) slice (cpu_kernels.h: the scores of a
//     query never leave a row buffer), with a hand-written backward that recomputes the weights
//     from each query's saved logsumexp; fp32 CPU tensors only. Tests compare its outputs and
//     gradients with the reference's, case by case.
// It exists because the reference's [B, H, N, N] score tensors dominate an ARM training step on
// the CPU (krause-train-bench --profile arm: bmm, copies, the mask and the softmax).
// Thread-safety: pure functions; the fused path parallelises over slices with at::parallel_for.
#pragma once

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "model/attention/krause_attention.h"

namespace krause {

// Which implementation `impl` means for these inputs. kReference: the reference.
// kFusedCpuTrain and kFusedCpu: the fused path (an error where the tensors are not fp32 on the
// CPU). kAuto: the fused path for fp32 CPU tensors while autograd records a graph that needs
// their gradients (training), else the reference (scoring and prefill keep their results bit for
// bit). kWindowed and kCuda have no softmax counterpart: the reference.
enum class SoftmaxRoute { kReference, kFusedCpu };
absl::StatusOr<SoftmaxRoute> ChooseSoftmaxRoute(KrauseImpl impl, bool cpu_fp32, bool recording);

// q, k, v: [B, H, N, d], same dtype, device and shape. Returns [B, H, N, d].
// Errors (InvalidArgument, naming the argument): rank or shape mismatch, dtype or device
// mismatch, N or d of 0, an implementation that cannot take these tensors. LibTorch errors are
// returned as Internal.
absl::StatusOr<at::Tensor> CausalSoftmaxAttention(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v,
                                                  KrauseImpl impl = KrauseImpl::kAuto);

}  // namespace krause
