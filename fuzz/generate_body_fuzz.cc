// libFuzzer: the body of an HTTP generation (POST /v2/models/{m}/generate_stream,
// v1/generate_body.h) through ParseGenerateBody: JSON of any shape, settings at the top level or in
// "parameters", a base64 or data: URL prompt. Whatever the bytes: no crash, no sanitizer report,
// every refusal says why, and an accepted body keeps every setting within the ranges it checks.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/core/defaults.h"
#include "server/v1/generate_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ks = krause::server;
  auto body = ks::ParseGenerateBody(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!body.ok()) {
    if (body.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  if (body->num_images < 0 || body->prompt_rows < 0 || body->update_interval_ms < 0 ||
      body->timeout_us < 0 || body->timeout_us > ks::defaults::kMaxTimeoutMicroseconds ||
      (body->top_k && *body->top_k < 0) || (body->label && body->class_index) ||
      (body->prompt && !body->prompt->png))
    std::abort();
  return 0;
}
