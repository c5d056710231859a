// libFuzzer: the model manifest (JSON text) through ParseManifest. Whatever the bytes: no crash,
// no sanitizer report, and an accepted manifest holds only valid, in-range entries.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/core/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto specs = krause::server::ParseManifest(text, "/models");
  if (!specs.ok()) return 0;
  if (specs->empty()) std::abort();
  for (const krause::server::ModelSpec& s : *specs) {
    if (s.name.empty() || s.name.size() > 64 || s.checkpoint.empty() || s.max_batch_size < 1 ||
        s.max_batch_size > 4096 || s.max_sequences < 1 || s.max_images_per_request < 0)
      std::abort();
  }
  return 0;
}
