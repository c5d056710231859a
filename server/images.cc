#include "server/images.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "model/data/png.h"

namespace krause::server {
namespace {

std::string ShapeString(int64_t h, int64_t w, int64_t c) { return absl::StrCat(h, "x", w, "x", c); }

}  // namespace

absl::StatusOr<at::Tensor> DecodeImage(const v1::Image& image, const std::string& field) {
  switch (image.data_case()) {
    case v1::Image::kPng: {
      if (image.png().empty())
        return absl::InvalidArgumentError(absl::StrCat(field, ".png is empty"));
      auto t = DecodePng(image.png());
      if (!t.ok())
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".png is not a readable PNG: ", t.status().message()));
      return *t;
    }
    case v1::Image::kRaw: {
      const v1::RawImage& r = image.raw();
      if (r.height() < 1 || r.width() < 1 || r.height() > 4096 || r.width() > 4096)
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".raw: height and width must be in [1, 4096], got ", r.height(),
                         "x", r.width()));
      if (r.channels() != 1 && r.channels() != 3)
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".raw.channels must be 1 or 3, got ", r.channels()));
      const int64_t want = int64_t{r.height()} * r.width() * r.channels();
      if (static_cast<int64_t>(r.pixels().size()) != want)
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".raw.pixels has ", r.pixels().size(), " bytes but height*width*channels = ",
            ShapeString(r.height(), r.width(), r.channels()), " = ", want));
      at::Tensor t =
          at::empty({int64_t{r.height()}, int64_t{r.width()}, int64_t{r.channels()}}, at::kByte);
      std::memcpy(t.data_ptr<uint8_t>(), r.pixels().data(), static_cast<size_t>(want));
      return t;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, " has neither png nor raw data"));
  }
}

v1::Image EncodeRawImage(const at::Tensor& hwc) {
  const at::Tensor c = hwc.contiguous();
  v1::Image im;
  v1::RawImage* raw = im.mutable_raw();
  raw->set_height(static_cast<uint32_t>(c.size(0)));
  raw->set_width(static_cast<uint32_t>(c.size(1)));
  raw->set_channels(static_cast<uint32_t>(c.size(2)));
  raw->set_pixels(c.data_ptr<uint8_t>(), static_cast<size_t>(c.numel()));
  return im;
}

absl::Status CheckShape(const at::Tensor& hwc, const ImageShape& shape, const std::string& field,
                        const std::string& model) {
  if (hwc.size(0) != shape.height || hwc.size(1) != shape.width || hwc.size(2) != shape.channels)
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": image is ", ShapeString(hwc.size(0), hwc.size(1), hwc.size(2)),
                     " (HxWxC) but model ", model, " takes ",
                     ShapeString(shape.height, shape.width, shape.channels)));
  return absl::OkStatus();
}

}  // namespace krause::server
