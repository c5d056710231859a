#include "server/images.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/data/png.h"
#include "server/raw_image.h"
#include "server/status.h"

namespace krause::server {
namespace {

std::string ShapeString(int64_t h, int64_t w, int64_t c) { return absl::StrCat(h, "x", w, "x", c); }

// The one shape rule, applied to a header before decoding.
absl::Status CheckBounds(int64_t h, int64_t w, int64_t c, const std::string& field,
                         const ImageBounds& b) {
  const ImageShape& s = b.shape;
  if (!b.prompt) {
    if (h == s.height && w == s.width && c == s.channels) return absl::OkStatus();
    return InvalidField(
        field, absl::StrCat(field, ": image is ", ShapeString(h, w, c), " (HxWxC) but model ",
                            b.model, " takes ", ShapeString(s.height, s.width, s.channels)));
  }
  if (w == s.width && c == s.channels && h >= 1 && h <= s.height) return absl::OkStatus();
  return InvalidField(
      field, absl::StrCat(field, ": image is ", ShapeString(h, w, c), " (HxWxC) but model ",
                          b.model, " takes prompts of width ", s.width, ", ", s.channels,
                          " channel(s) and at most ", s.height, " rows"));
}

}  // namespace

absl::StatusOr<at::Tensor> DecodePngImage(std::string_view png, const std::string& field,
                                          const ImageBounds& bounds) {
  if (png.empty()) return InvalidField(field, absl::StrCat(field, " is empty"));
  // The bounds' errors name the field without ".png".
  const std::string image =
      absl::EndsWith(field, ".png") ? field.substr(0, field.size() - 4) : field;
  auto t = DecodePng(png, 0, [&](const PngInfo& info) {
    return CheckBounds(info.height, info.width, info.channels, image, bounds);
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

absl::StatusOr<at::Tensor> DecodeImage(const v1::Image& image, const std::string& field,
                                       const ImageBounds& bounds) {
  switch (image.data_case()) {
    case v1::Image::kPng:
      return DecodePngImage(image.png(), field + ".png", bounds);
    case v1::Image::kRaw: {
      const v1::RawImage& r = image.raw();
      if (r.channels() != 1 && r.channels() != 3)
        return InvalidField(
            field + ".raw.channels",
            absl::StrCat(field, ".raw.channels must be 1 or 3, got ", r.channels()));
      absl::Status st = CheckBounds(r.height(), r.width(), r.channels(), field, bounds);
      if (!st.ok()) return st;
      const int64_t want = int64_t{r.height()} * r.width() * r.channels();
      if (static_cast<int64_t>(r.pixels().size()) != want)
        return InvalidField(
            field + ".raw.pixels",
            absl::StrCat(field, ".raw.pixels has ", r.pixels().size(),
                         " bytes but height*width*channels = ",
                         ShapeString(r.height(), r.width(), r.channels()), " = ", want));
      at::Tensor t =
          at::empty({int64_t{r.height()}, int64_t{r.width()}, int64_t{r.channels()}}, at::kByte);
      std::memcpy(t.data_ptr<uint8_t>(), r.pixels().data(), static_cast<size_t>(want));
      return t;
    }
    default:
      return InvalidField(field, absl::StrCat(field, " has neither png nor raw data"));
  }
}

v1::Image EncodeRawImage(const at::Tensor& hwc) {
  const at::Tensor c = hwc.contiguous();
  return RawImageProto(
      c.size(0), c.size(1), c.size(2),
      std::string_view(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), c.numel()));
}

}  // namespace krause::server
