// OpenAI's Images API (POST /v1/images/generations, openai_http.h) in native types: its JSON body
// read before any model is known (types and ranges, unknown names refused), then, against the
// model, its settings as the core's GenerateSettings: the prompt names a class of the model (its
// label in any case, or its index; empty: unconditional), `n` is the number of images, `size`
// must be the model's own or "auto". Each of the API's names is mapped to its setting here and
// nowhere else; seed, temperature, top_p, top_k and guidance are this server's extensions under
// krause.v1's names. Errors are InvalidArgument naming the parameter as the API names it.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/core/generate_settings.h"
#include "server/core/model_info.h"

namespace krause::server::openai {

struct ImagesRequest {
  std::string model;   // "": the default generator
  std::string prompt;  // a class: a label (any case) or an index; "": unconditional
  int64_t n = 1;       // images
  std::string size = "auto";
  bool stream = false;
  int64_t partial_images = 0;  // 0 to 3, with stream
  GenerateSettings settings;   // the extensions (seed, sampling, guidance)
};

absl::StatusOr<ImagesRequest> ParseImagesRequest(std::string_view json);

// The request's settings against `model` (a generator): the class, the count, the size checked.
absl::StatusOr<GenerateSettings> SettingsFor(const ImagesRequest& request, const ModelInfo& model);

}  // namespace krause::server::openai
