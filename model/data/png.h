// PNG encode/decode of 8-bit gray and RGB images through libpng's simplified API.
// Tensors are [H, W, C] uint8, C = 1 (gray) or 3 (RGB). Thread-safety: free functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"

namespace krause {

// What a PNG's header says, read before anything is decoded.
struct PngInfo {
  int64_t height = 0, width = 0;
  int channels = 0;  // what DecodePng produces: the requested channels, else the file's (1 or 3)
};

// The most a decode may produce, whatever the caller accepts: 2^26 bytes (64 MiB, e.g. 4096 x
// 4096 x 3 plus room). A header over it is refused before any allocation.
inline constexpr int64_t kMaxPngDecodedBytes = int64_t{1} << 26;

// Decides from the header whether to decode at all: a non-OK status is returned as is and nothing
// is allocated (a small file can claim any size; only the header is trusted to be read).
using PngHeaderCheck = absl::AnyInvocable<absl::Status(const PngInfo&) const>;

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
