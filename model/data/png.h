// PNG encode/decode of 8-bit gray and RGB images through libpng's simplified API.
// Tensors are [H, W, C] uint8, C = 1 (gray) or 3 (RGB). Thread-safety: free functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/util/png_pixels.h"

namespace krause {

// channels: 1 or 3 converts to that layout; 0 keeps the file's (gray -> 1, anything else -> 3).
// Corrupt data gives InvalidArgument with libpng's message; `check` (optional) runs on the header
// first, then a header over kMaxPngDecodedBytes gives InvalidArgument naming the size and limit.
// Never throws (an allocation failure is ResourceExhausted).
absl::StatusOr<at::Tensor> DecodePng(std::string_view bytes, int channels = 0,
                                     const PngHeaderCheck& check = nullptr);
absl::StatusOr<std::string> EncodePng(const at::Tensor& hwc);
absl::Status WritePng(const std::string& path, const at::Tensor& hwc);

// Tiles images [N, C, H, W] uint8 into one HWC image of ceil(N / cols) rows and `cols` columns,
// 1-pixel gray (128) gaps between and around them: for sample grids.
at::Tensor ImageGrid(const at::Tensor& images, int64_t cols);
absl::StatusOr<at::Tensor> ReadPng(const std::string& path, int channels = 0);

}  // namespace krause
