// The web page's files (server/web/page/), compiled in: web_assets.cc is generated at build time
// by embed.cmake. Each file's bytes are followed by a 0 that `size` does not count.
#pragma once

#include <cstddef>

namespace krause::server {

struct WebAsset {
  const char* name;  // its path under server/web/page/, e.g. "app.js"
  const unsigned char* data;
  size_t size;
};
extern const WebAsset kWebAssets[];
extern const int kWebAssetCount;

}  // namespace krause::server
