#include "server/v1/images.h"

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/edge/status.h"
#include "server/v1/raw_image.h"

namespace krause::server {
absl::StatusOr<at::Tensor> DecodeImage(const v1::Image& image, const std::string& field,
                                       const ImageBounds& bounds) {
  switch (image.data_case()) {
    case v1::Image::kPng:
      return DecodePngImage(image.png(), field + ".png", bounds);
    case v1::Image::kRaw: {
      const v1::RawImage& r = image.raw();
      return DecodeRawImage(r.pixels(), r.height(), r.width(), r.channels(), field, bounds);
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
