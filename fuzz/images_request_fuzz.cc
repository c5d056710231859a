// libFuzzer: OpenAI's image request (POST /v1/images/generations, openai/images_request.h)
// through ParseImagesRequest and then SettingsFor against a small conditional model: JSON of any
// shape. Whatever the bytes: no crash, no sanitizer report, every refusal says why, and accepted
// settings keep the ranges the parser checks (n at least 1, partial_images 0 to 3 and only with
// stream, a class within the model's).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/openai/images_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ks = krause::server;
  auto r =
      ks::openai::ParseImagesRequest(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!r.ok()) {
    if (r.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  if (r->n < 1 || r->partial_images < 0 || r->partial_images > 3 ||
      (r->partial_images > 0 && !r->stream))
    std::abort();
  ks::ModelInfo m;
  m.name = "g";
  m.classes = 3;
  m.labels = {"zero", "one", "two"};
  m.shape = {6, 6, 1};
  m.max_images_per_request = 8;
  auto g = ks::openai::SettingsFor(*r, m);
  if (!g.ok()) {
    if (g.status().message().empty()) std::abort();
    return 0;
  }
  if (g->num_images < 1 || g->num_images > 8 || !g->answer_once ||
      (g->class_index && (*g->class_index < 0 || *g->class_index >= 3)))
    std::abort();
  return 0;
}
