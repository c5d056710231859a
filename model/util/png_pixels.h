// PNG encode and decode of 8-bit pixel buffers through libpng's simplified API, without LibTorch
// (the clients use it; model/data/png.h has the tensor forms). Pixels are row-major HWC, 1 (gray)
// or 3 (RGB) channels. Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"

namespace krause {

// What a PNG's header says, read before anything is decoded.
struct PngInfo {
  int64_t height = 0, width = 0;
  int channels = 0;  // what a decode produces: the requested channels, else the file's (1 or 3)
};

// The most a decode may produce, whatever the caller accepts: 2^26 bytes (64 MiB, e.g. 4096 x
// 4096 x 3 plus room). A header over it is refused before any allocation.
inline constexpr int64_t kMaxPngDecodedBytes = int64_t{1} << 26;

// Decides from the header whether to decode at all: a non-OK status is returned as is and nothing
// is allocated (a small file can claim any size; only the header is trusted to be read).
using PngHeaderCheck = absl::AnyInvocable<absl::Status(const PngInfo&) const>;

struct PixelBuffer {
  int64_t height = 0, width = 0;
  int channels = 0;
  std::string pixels;  // height * width * channels bytes, row-major HWC
};

// `pixels`: height * width * channels bytes, channels 1 (gray), 2 (gray and alpha), 3 (RGB) or 4
// (RGBA). InvalidArgument for a bad shape.
absl::StatusOr<std::string> EncodePngPixels(std::string_view pixels, int64_t height, int64_t width,
                                            int channels);
// channels: 1 or 3 converts to that layout; 0 keeps the file's (gray -> 1, anything else -> 3).
// Corrupt data gives InvalidArgument with libpng's message; `check` (optional) runs on the header
// first, then a header over kMaxPngDecodedBytes gives InvalidArgument naming the size and limit.
// Never throws (an allocation failure is ResourceExhausted).
absl::StatusOr<PixelBuffer> DecodePngPixels(std::string_view png, int channels = 0,
                                            const PngHeaderCheck& check = nullptr);
// What the PNG's header says (channels: the file's layout, as a decode with channels 0 gives),
// nothing decoded. InvalidArgument as DecodePngPixels's for a file that is not a PNG.
absl::StatusOr<PngInfo> ReadPngInfo(std::string_view png);
// The PNG's alpha channel alone, one byte per pixel (channels 1): 0 fully transparent, 255
// opaque, and 255 everywhere for a file without alpha (a tRNS chunk counts as alpha). `check`
// sees channels 1; errors as DecodePngPixels's.
absl::StatusOr<PixelBuffer> DecodePngAlpha(std::string_view png,
                                           const PngHeaderCheck& check = nullptr);

}  // namespace krause
