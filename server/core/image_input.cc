#include "server/core/image_input.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/data/png.h"
#include "server/core/errors.h"

namespace krause::server {
std::string ImageSizeText(int64_t h, int64_t w, int64_t c) {
  return absl::StrCat(h, "x", w, "x", c);
}

// The one shape rule, applied to a header before decoding.
absl::Status CheckImageBounds(int64_t h, int64_t w, int64_t c, const std::string& field,
                              const ImageBounds& b) {
  const ImageShape& s = b.shape;
  if (!b.prompt) {
    if (h == s.height && w == s.width && c == s.channels) return absl::OkStatus();
    return InvalidField(
        field, absl::StrCat(field, ": image is ", ImageSizeText(h, w, c), " (HxWxC) but model ",
                            b.model, " takes ", ImageSizeText(s.height, s.width, s.channels)));
  }
  if (w == s.width && c == s.channels && h >= 1 && h <= s.height) return absl::OkStatus();
  return InvalidField(
      field, absl::StrCat(field, ": image is ", ImageSizeText(h, w, c), " (HxWxC) but model ",
                          b.model, " takes prompts of width ", s.width, ", ", s.channels,
                          " channel(s) and at most ", s.height, " rows"));
}

absl::StatusOr<at::Tensor> DecodePngImage(std::string_view png, const std::string& field,
                                          const ImageBounds& bounds) {
  if (png.empty()) return InvalidField(field, absl::StrCat(field, " is empty"));
  // The bounds' errors name the field without ".png".
  const std::string image =
      absl::EndsWith(field, ".png") ? field.substr(0, field.size() - 4) : field;
  auto t = DecodePng(png, 0, [&](const PngInfo& info) {
    return CheckImageBounds(info.height, info.width, info.channels, image, bounds);
  });
  if (!t.ok()) {
    if (absl::IsInvalidArgument(t.status()) && absl::StartsWith(t.status().message(), image + ":"))
      return t.status();  // the bounds: already names the field
    const absl::Status st(t.status().code(),
                          absl::StrCat(field, " is not a readable PNG: ", t.status().message()));
    return absl::IsInvalidArgument(st) ? WithField(st, field) : st;
  }
  return *t;
}

absl::StatusOr<at::Tensor> DecodeRawImage(std::string_view pixels, int64_t height, int64_t width,
                                          int64_t channels, const std::string& field,
                                          const ImageBounds& bounds) {
  if (channels != 1 && channels != 3)
    return InvalidField(field + ".raw.channels",
                        absl::StrCat(field, ".raw.channels must be 1 or 3, got ", channels));
  absl::Status st = CheckImageBounds(height, width, channels, field, bounds);
  if (!st.ok()) return st;
  const int64_t want = height * width * channels;
  if (static_cast<int64_t>(pixels.size()) != want)
    return InvalidField(field + ".raw.pixels",
                        absl::StrCat(field, ".raw.pixels has ", pixels.size(),
                                     " bytes but height*width*channels = ",
                                     ImageSizeText(height, width, channels), " = ", want));
  at::Tensor t = at::empty({height, width, channels}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), pixels.data(), static_cast<size_t>(want));
  return t;
}

absl::StatusOr<at::Tensor> DecodeRequestImage(const RequestImage& image, const std::string& field,
                                              const ImageBounds& bounds) {
  if (image.png) return DecodePngImage(image.bytes, field, bounds);
  return DecodeRawImage(image.bytes, image.height, image.width, image.channels, field, bounds);
}

}  // namespace krause::server
