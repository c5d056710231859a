// libFuzzer: a request image as the server receives it (krause.v1.Image bytes: a PNG or raw
// pixels with their shape), decoded with the server's bounds for a 28x28x1 model, as a Classify
// image and as a completion prompt. Whatever the bytes: no crash, no sanitizer report, and an
// accepted image is exactly within the bounds.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>

#include "server/v1/images.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  krause::v1::Image image;
  if (!image.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (bool prompt : {false, true}) {
    krause::server::ImageBounds bounds;
    bounds.shape = {28, 28, 1};
    bounds.model = "m";
    bounds.prompt = prompt;
    auto t = krause::server::DecodeImage(image, "images[0]", bounds);
    if (!t.ok()) continue;
    const bool fits = t->dim() == 3 && t->size(1) == 28 && t->size(2) == 1 &&
                      (prompt ? (t->size(0) >= 1 && t->size(0) <= 28) : t->size(0) == 28);
    if (!fits) std::abort();
  }
  return 0;
}
