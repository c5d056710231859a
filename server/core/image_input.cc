#include "server/core/image_input.h"

#include <ATen/ATen.h>

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

}  // namespace krause::server
