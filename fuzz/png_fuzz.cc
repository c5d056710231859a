// libFuzzer: DecodePng on arbitrary bytes, with a header check like the server's (here: at most
// 64 x 64). Whatever the bytes: no crash, no sanitizer report, nothing decoded beyond the check,
// and a decoded image survives an encode/decode round trip unchanged.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "model/data/png.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (int channels : {0, 1, 3}) {
    auto t = krause::DecodePng(bytes, channels, [](const krause::PngInfo& info) {
      if (info.height > 64 || info.width > 64) return absl::InvalidArgumentError("over 64 x 64");
      return absl::OkStatus();
    });
    if (!t.ok()) continue;
    if (t->dim() != 3 || t->size(0) > 64 || t->size(1) > 64 ||
        (channels != 0 && t->size(2) != channels))
      std::abort();  // the header check was bypassed
    auto again = krause::EncodePng(*t);
    if (!again.ok()) std::abort();
    auto back = krause::DecodePng(*again, static_cast<int>(t->size(2)));
    if (!back.ok() || !at::equal(*back, *t)) std::abort();
  }
  return 0;
}
