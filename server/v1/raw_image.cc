#include "server/v1/raw_image.h"

namespace krause::server {

v1::Image RawImageProto(int64_t height, int64_t width, int64_t channels, std::string_view pixels) {
  v1::Image im;
  v1::RawImage* raw = im.mutable_raw();
  raw->set_height(static_cast<uint32_t>(height));
  raw->set_width(static_cast<uint32_t>(width));
  raw->set_channels(static_cast<uint32_t>(channels));
  raw->set_pixels(pixels.data(), pixels.size());
  return im;
}

}  // namespace krause::server
