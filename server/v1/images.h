// krause.v1.Image (PNG bytes or raw HWC pixels) to tensors through core/image_input.h, with errors
// that name the field and the limit, and tensors back to raw images (clients, tests).
// Thread-safety: pure functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "krause/v1/krause.pb.h"
#include "server/core/image_input.h"

namespace krause::server {

// Decodes `image` to [H, W, C] uint8 (CPU). `field` names it in errors ("images[3]"); an image
// that is not within `bounds` is InvalidArgument naming the field, the size and what the model
// takes ("images[3]: image is 32x32x3 (HxWxC) but model m takes 28x28x1").
absl::StatusOr<at::Tensor> DecodeImage(const v1::Image& image, const std::string& field,
                                       const ImageBounds& bounds);

// The inverse of DecodeImage for raw pixels: hwc [H, W, C] uint8 (any layout, CPU) as an Image.
v1::Image EncodeRawImage(const at::Tensor& hwc);

}  // namespace krause::server
