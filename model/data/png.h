// PNG encode/decode of 8-bit gray and RGB images through libpng's simplified API.
// Tensors are [H, W, C] uint8, C = 1 (gray) or 3 (RGB). Thread-safety: free functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace krause {

// channels: 1 or 3 converts to that layout; 0 keeps the file's (gray -> 1, anything else -> 3).
// Corrupt data gives InvalidArgument with libpng's message.
absl::StatusOr<at::Tensor> DecodePng(std::string_view bytes, int channels = 0);
absl::StatusOr<std::string> EncodePng(const at::Tensor& hwc);
absl::Status WritePng(const std::string& path, const at::Tensor& hwc);
absl::StatusOr<at::Tensor> ReadPng(const std::string& path, int channels = 0);

}  // namespace krause
