// Request images (krause.v1.Image: PNG bytes or raw HWC pixels) to tensors, with errors that
// name the field and the limit, and tensors back to raw images (clients, tests).
// Thread-safety: pure functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/statusor.h"
#include "krause/v1/krause.pb.h"

namespace krause::server {

struct ImageShape {
  int64_t height = 0, width = 0, channels = 0;
};

// Decodes `image` to [H, W, C] uint8 (CPU). `field` names it in errors ("images[3]").
absl::StatusOr<at::Tensor> DecodeImage(const v1::Image& image, const std::string& field);

// The inverse of DecodeImage for raw pixels: hwc [H, W, C] uint8 (any layout, CPU) as an Image.
v1::Image EncodeRawImage(const at::Tensor& hwc);

// InvalidArgument unless hwc is exactly `shape` ("images[3]: image is 32x32x3 but model m takes
// 28x28x1").
absl::Status CheckShape(const at::Tensor& hwc, const ImageShape& shape, const std::string& field,
                        const std::string& model);

}  // namespace krause::server
