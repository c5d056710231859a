// libFuzzer: ParseSafetensors on arbitrary bytes. Whatever the bytes: no crash, no sanitizer
// report, no allocation beyond the file's size (libFuzzer's -rss_limit_mb and -malloc_limit_mb
// catch one), and what parses serialises back to a file that parses to the same tensors.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "model/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto parsed = krause::ParseSafetensors(bytes);
  if (!parsed.ok()) return 0;
  auto again = krause::SerializeSafetensors(parsed->tensors, parsed->metadata);
  if (!again.ok()) return 0;  // e.g. a dtype the writer refuses
  auto back = krause::ParseSafetensors(*again);
  if (!back.ok() || back->tensors.size() != parsed->tensors.size()) std::abort();
  for (size_t i = 0; i < back->tensors.size(); ++i) {
    const at::Tensor& a = parsed->tensors[i].second;
    const at::Tensor& b = back->tensors[i].second;
    if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type() ||
        (a.numel() > 0 && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) != 0))
      std::abort();
  }
  return 0;
}
