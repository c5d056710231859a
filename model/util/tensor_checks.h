// Argument checks for tensors crossing a model/ boundary. Each returns InvalidArgument naming the
// argument and what was expected, so that callers (and in the end gRPC clients) see the field.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace krause {

std::string ShapeString(at::IntArrayRef sizes);

// An exception's message for a status or a log line: a c10::Error (TORCH_CHECK and LibTorch's own
// checks) without the C++ backtrace that LibTorch appends to what(); any other exception's what().
std::string ExceptionMessage(const std::exception& e);

absl::Status CheckDefined(const at::Tensor& t, const char* name);
absl::Status CheckRank(const at::Tensor& t, int64_t rank, const char* name, const char* layout);
absl::Status CheckSameShape(const at::Tensor& t, const at::Tensor& ref, const char* name,
                            const char* ref_name);
absl::Status CheckFloating(const at::Tensor& t, const char* name);
absl::Status CheckSameTypeAndDevice(const at::Tensor& t, const at::Tensor& ref, const char* name,
                                    const char* ref_name);

// log_sigma: numel 1 (shared by all heads) or numel `heads` (one per head), finite.
// Returns a [heads] tensor with `options`' dtype and device (gradients flow through the view).
absl::StatusOr<at::Tensor> NormalizeLogSigma(const at::Tensor& log_sigma, int64_t heads,
                                             const at::TensorOptions& options);

}  // namespace krause
