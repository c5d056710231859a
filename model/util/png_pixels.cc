#include "model/util/png_pixels.h"

#include <png.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace krause {

absl::StatusOr<std::string> EncodePngPixels(std::string_view pixels, int64_t height, int64_t width,
                                            int channels) {
  if (height < 1 || width < 1 || channels < 1 || channels > 4 ||
      static_cast<int64_t>(pixels.size()) != height * width * channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("PNG encode needs height x width x (1 to 4) bytes, got ", pixels.size(),
                     " bytes for ", height, "x", width, "x", channels));
  }
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  constexpr png_uint_32 kFormats[] = {PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB,
                                      PNG_FORMAT_RGBA};
  image.format = kFormats[channels - 1];
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encode failed: ", image.message));
  }
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encode failed: ", image.message));
  }
  out.resize(size);
  return out;
}

namespace {

// Reads the signature and the header chunks into `image` only: nothing is decompressed yet. On
// failure `image` is freed.
absl::Status BeginRead(std::string_view png, png_image* image) {
  std::memset(image, 0, sizeof(*image));
  image->version = PNG_IMAGE_VERSION;
  if (png_image_begin_read_from_memory(image, png.data(), png.size())) return absl::OkStatus();
  const std::string msg = image->message;
  png_image_free(image);
  return absl::InvalidArgumentError(absl::StrCat("not a valid PNG: ", msg));
}

// Decodes into `channels` bytes per pixel of `format` (libpng's simplified API converts whatever
// the file holds); `channels` 0 picks the file's colour layout (gray -> 1, anything else -> 3).
absl::StatusOr<PixelBuffer> Decode(std::string_view png, int channels, bool alpha,
                                   const PngHeaderCheck& check) {
  png_image image;
  if (absl::Status st = BeginRead(png, &image); !st.ok()) return st;
  if (channels == 0) channels = (image.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
  const PngInfo info{static_cast<int64_t>(image.height), static_cast<int64_t>(image.width),
                     alpha ? 1 : channels};
  const int stride = channels + (alpha ? 1 : 0);  // bytes per decoded pixel
  // The caller's check first (its message is the more specific one), then the absolute limit.
  absl::Status st = check ? check(info) : absl::OkStatus();
  const int64_t decoded = info.height * info.width * stride;  // < 2^64: 32-bit sides
  if (st.ok() && decoded > kMaxPngDecodedBytes) {
    st = absl::InvalidArgumentError(
        absl::StrCat("the PNG header claims ", info.height, "x", info.width, "x", stride, " = ",
                     decoded, " bytes decoded, over the limit of ", kMaxPngDecodedBytes));
  }
  if (!st.ok()) {
    png_image_free(&image);
    return st;
  }
  image.format =
      (channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0u);
  PixelBuffer out{info.height, info.width, stride, {}};
  try {
    out.pixels.resize(static_cast<size_t>(decoded));
  } catch (const std::exception& e) {
    png_image_free(&image);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", decoded, " bytes for a PNG: ", e.what()));
  }
  if (!png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr)) {
    const std::string msg = image.message;
    png_image_free(&image);
    return absl::InvalidArgumentError(absl::StrCat("corrupt PNG: ", msg));
  }
  return out;
}

}  // namespace

absl::StatusOr<PixelBuffer> DecodePngPixels(std::string_view png, int channels,
                                            const PngHeaderCheck& check) {
  if (channels != 0 && channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(absl::StrCat("channels must be 0, 1 or 3, got ", channels));
  }
  return Decode(png, channels, /*alpha=*/false, check);
}

absl::StatusOr<PngInfo> ReadPngInfo(std::string_view png) {
  png_image image;
  if (absl::Status st = BeginRead(png, &image); !st.ok()) return st;
  const PngInfo info{static_cast<int64_t>(image.height), static_cast<int64_t>(image.width),
                     (image.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1};
  png_image_free(&image);
  return info;
}

absl::StatusOr<PixelBuffer> DecodePngAlpha(std::string_view png, const PngHeaderCheck& check) {
  auto ga = Decode(png, 1, /*alpha=*/true, check);  // gray and alpha: the smallest with alpha
  if (!ga.ok()) return ga.status();
  const size_t pixels = ga->pixels.size() / 2;
  for (size_t i = 0; i < pixels; ++i) ga->pixels[i] = ga->pixels[2 * i + 1];
  ga->pixels.resize(pixels);
  ga->channels = 1;
  return ga;
}

}  // namespace krause
