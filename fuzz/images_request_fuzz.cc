// libFuzzer: OpenAI's image requests (openai/images_request.h) through their parsers and then
// SettingsFor against a small conditional model: a generation's JSON of any shape, or, for an
// input whose first line starts "multipart/", an edit: that line the Content-Type and the rest
// its multipart/form-data body (edge/multipart.h; the image and mask PNGs' alpha decoded, the
// mask's band checked). Whatever the bytes: no crash, no sanitizer report, every refusal says
// why (its details in UTF-8 only), and accepted settings keep the ranges the parser checks (n at
// least 1, partial_images 0 to 3 and only with stream, a class within the model's, an edit's kept
// rows within the image).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/core/errors.h"
#include "server/core/utf8.h"
#include "server/openai/images_request.h"

namespace ks = krause::server;

// A refusal says why, and its google.rpc details hold UTF-8 only (what protobuf's strings must).
void CheckRefusal(const absl::Status& st) {
  if (st.message().empty()) std::abort();
  for (const auto& [field, description] : ks::DetailsOf(st).fields)
    if (!ks::IsUtf8(field) || !ks::IsUtf8(description)) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t eol = input.find('\n');
  const bool edit = input.substr(0, 10) == "multipart/" && eol != std::string_view::npos;
  auto r = edit ? ks::openai::ParseImageEditForm(input.substr(0, eol), input.substr(eol + 1))
                : ks::openai::ParseImagesRequest(input);
  if (!r.ok()) {
    CheckRefusal(r.status());
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
    CheckRefusal(g.status());
    return 0;
  }
  if (g->num_images < 1 || g->num_images > 8 || !g->answer_once ||
      (g->class_index && (*g->class_index < 0 || *g->class_index >= 3)) || g->prompt_rows < 0 ||
      g->prompt_rows >= 6 || (g->prompt_rows > 0) != g->prompt.has_value() ||
      (g->prompt_rows > 0 && !edit))
    std::abort();
  return 0;
}
