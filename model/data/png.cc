#include "model/data/png.h"

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "model/util/files.h"
#include "model/util/png_pixels.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {

absl::StatusOr<at::Tensor> DecodePng(std::string_view bytes, int channels,
                                     const PngHeaderCheck& check) {
  ASSIGN_OR_RETURN(PixelBuffer px, DecodePngPixels(bytes, channels, check));
  try {
    at::Tensor out = at::empty({px.height, px.width, px.channels}, at::kByte);
    std::memcpy(out.data_ptr(), px.pixels.data(), px.pixels.size());
    return out;
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", px.pixels.size(),
                                                     " bytes for a PNG: ", ExceptionMessage(e)));
  }
}

absl::StatusOr<std::string> EncodePng(const at::Tensor& hwc) {
  if (!hwc.defined() || hwc.dim() != 3 || (hwc.size(2) != 1 && hwc.size(2) != 3) ||
      hwc.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError(
        absl::StrCat("PNG encode needs a uint8 [H, W, 1 or 3] tensor, got ",
                     hwc.defined() ? ShapeString(hwc.sizes()) : "undefined"));
  }
  const at::Tensor c = hwc.contiguous().cpu();
  return EncodePngPixels(
      std::string_view(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel())),
      c.size(0), c.size(1), static_cast<int>(c.size(2)));
}

absl::Status WritePng(const std::string& path, const at::Tensor& hwc) {
  ASSIGN_OR_RETURN(const std::string bytes, EncodePng(hwc));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return f ? absl::OkStatus() : absl::DataLossError(absl::StrCat("short write to ", path));
}

absl::StatusOr<at::Tensor> ReadPng(const std::string& path, int channels) {
  auto bytes = ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  auto r = DecodePng(*bytes, channels);
  if (!r.ok())
    return absl::Status(r.status().code(), absl::StrCat(path, ": ", r.status().message()));
  return r;
}

at::Tensor ImageGrid(const at::Tensor& images, int64_t cols) {
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  const int64_t rows = (n + cols - 1) / cols;
  at::Tensor out = at::full({rows * (h + 1) + 1, cols * (w + 1) + 1, c}, 128, at::kByte);
  for (int64_t i = 0; i < n; ++i) {
    out.narrow(0, 1 + (i / cols) * (h + 1), h)
        .narrow(1, 1 + (i % cols) * (w + 1), w)
        .copy_(images[i].permute({1, 2, 0}));
  }
  return out;
}

}  // namespace krause
