#include "model/data/png.h"

#include <ATen/ATen.h>
#include <png.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "model/util/files.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {

absl::StatusOr<at::Tensor> DecodePng(std::string_view bytes, int channels,
                                     const PngHeaderCheck& check) {
  if (channels != 0 && channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(absl::StrCat("channels must be 0, 1 or 3, got ", channels));
  }
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  // Reads the signature and the header chunks only: nothing is decompressed yet.
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    const std::string msg = image.message;
    png_image_free(&image);
    return absl::InvalidArgumentError(absl::StrCat("not a valid PNG: ", msg));
  }
  if (channels == 0) channels = (image.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
  const PngInfo info{static_cast<int64_t>(image.height), static_cast<int64_t>(image.width),
                     channels};
  // The caller's check first (its message is the more specific one), then the absolute limit.
  absl::Status st = check ? check(info) : absl::OkStatus();
  const int64_t decoded = info.height * info.width * info.channels;  // < 2^64: 32-bit sides
  if (st.ok() && decoded > kMaxPngDecodedBytes) {
    st = absl::InvalidArgumentError(
        absl::StrCat("the PNG header claims ", info.height, "x", info.width, "x", info.channels,
                     " = ", decoded, " bytes decoded, over the limit of ", kMaxPngDecodedBytes));
  }
  if (!st.ok()) {
    png_image_free(&image);
    return st;
  }
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  at::Tensor out;
  try {
    out = at::empty({info.height, info.width, channels}, at::kByte);
  } catch (const std::exception& e) {
    png_image_free(&image);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", decoded, " bytes for a PNG: ", e.what()));
  }
  if (!png_image_finish_read(&image, nullptr, out.data_ptr(), 0, nullptr)) {
    const std::string msg = image.message;
    png_image_free(&image);
    return absl::InvalidArgumentError(absl::StrCat("corrupt PNG: ", msg));
  }
  return out;
}

absl::StatusOr<std::string> EncodePng(const at::Tensor& hwc) {
  if (!hwc.defined() || hwc.dim() != 3 || (hwc.size(2) != 1 && hwc.size(2) != 3) ||
      hwc.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError(
        absl::StrCat("PNG encode needs a uint8 [H, W, 1 or 3] tensor, got ",
                     hwc.defined() ? ShapeString(hwc.sizes()) : "undefined"));
  }
  const at::Tensor c = hwc.contiguous().cpu();
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(c.size(1));
  image.height = static_cast<png_uint_32>(c.size(0));
  image.format = c.size(2) == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, c.data_ptr(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encode failed: ", image.message));
  }
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, c.data_ptr(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encode failed: ", image.message));
  }
  out.resize(size);
  return out;
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
