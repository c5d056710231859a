#include "server/v1/images.h"

#include <ATen/ATen.h>

#include <cstring>

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
      if (r.channels() != 1 && r.channels() != 3)
        return InvalidField(
            field + ".raw.channels",
            absl::StrCat(field, ".raw.channels must be 1 or 3, got ", r.channels()));
      absl::Status st = CheckImageBounds(r.height(), r.width(), r.channels(), field, bounds);
      if (!st.ok()) return st;
      const int64_t want = int64_t{r.height()} * r.width() * r.channels();
      if (static_cast<int64_t>(r.pixels().size()) != want)
        return InvalidField(
            field + ".raw.pixels",
            absl::StrCat(field, ".raw.pixels has ", r.pixels().size(),
                         " bytes but height*width*channels = ",
                         ImageSizeText(r.height(), r.width(), r.channels()), " = ", want));
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
