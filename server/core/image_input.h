// Request images in native form: the shape a model takes (ImageBounds), checked from a PNG's
// header (or a raw image's fields) before any pixel is decoded or copied, with errors that name
// the field and the limit. Every front end's images go through here (krause.v1's Image:
// v1/images.h; the Open Inference Protocol's tensors: oip/oip_infer.cc).
// Thread-safety: pure functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/core/generate_settings.h"
#include "server/core/model_info.h"

namespace krause::server {

// What a request image must be, checked from the PNG header (or the raw fields) before any pixel
// is decoded or copied, so that a small file claiming a huge size costs nothing.
struct ImageBounds {
  ImageShape shape;     // the model's
  std::string model;    // named in errors
  bool prompt = false;  // a completion prompt: width and channels exact, height 1..shape.height
};

// "28x28x1": an image's size as the errors write it (HxWxC).
std::string ImageSizeText(int64_t h, int64_t w, int64_t c);

// OK when an image of h x w x c is within `bounds`; else InvalidArgument naming `field`, the size
// and what the model takes ("images[3]: image is 32x32x3 (HxWxC) but model m takes 28x28x1").
absl::Status CheckImageBounds(int64_t h, int64_t w, int64_t c, const std::string& field,
                              const ImageBounds& bounds);

// PNG bytes to [H, W, C] uint8 (CPU), the header checked against `bounds` first. `field` names the
// PNG in errors ("input image[2]"); a field ending in ".png" is named without it in shape errors,
// as DecodeImage does.
absl::StatusOr<at::Tensor> DecodePngImage(std::string_view png, const std::string& field,
                                          const ImageBounds& bounds);

// Raw HWC pixels to [H, W, C] uint8 (CPU): channels 1 or 3, the size within `bounds`, and
// exactly height*width*channels bytes; errors name `field`.raw.channels, `field` (the size) and
// `field`.raw.pixels.
absl::StatusOr<at::Tensor> DecodeRawImage(std::string_view pixels, int64_t height, int64_t width,
                                          int64_t channels, const std::string& field,
                                          const ImageBounds& bounds);

// A request image as sent (generate_settings.h): a PNG through DecodePngImage (`field` as the
// PNG's name), raw pixels through DecodeRawImage.
absl::StatusOr<at::Tensor> DecodeRequestImage(const RequestImage& image, const std::string& field,
                                              const ImageBounds& bounds);

}  // namespace krause::server
