// krause.v1.Image from raw HWC pixels, without LibTorch: the clients and the load generator build
// requests with it; images.h (tensors) builds on it. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "krause/v1/krause.pb.h"

namespace krause::server {

// pixels: height * width * channels bytes, row-major HWC.
v1::Image RawImageProto(int64_t height, int64_t width, int64_t channels, std::string_view pixels);

}  // namespace krause::server
