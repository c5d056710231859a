// OpenAI's Images API (POST /v1/images/generations and /v1/images/edits, openai_http.h) in native
// types: a generation's JSON body, or an edit's multipart/form-data (its text fields the same
// parameters, numbers and booleans as text, plus the `image` file and an optional `mask` file),
// read before any model is known (types and ranges, unknown names refused); then, against the
// model, its settings as the core's GenerateSettings: the prompt names a class of the model (its
// label in any case, or its index; empty: unconditional), `n` is the number of images, `size`
// must be the model's own or "auto". An edit is a completion: the image's rows above the mask's
// first fully transparent row (alpha 0; without a mask, the image's own alpha) are kept and the
// rest sampled, so the transparent region must be a band of whole bottom rows. Each of the API's
// names is mapped to its setting here and nowhere else; seed, temperature, top_p, top_k and
// guidance are this server's extensions under krause.v1's names. Errors are InvalidArgument
// naming the parameter as the API names it.
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
  // An edit: the image to complete and its mask, PNG bytes ("" mask: the image's alpha is one).
  bool edit = false;
  std::string image, mask;
};

absl::StatusOr<ImagesRequest> ParseImagesRequest(std::string_view json);
// An edit's multipart/form-data body; `content_type` is the request's header.
absl::StatusOr<ImagesRequest> ParseImageEditForm(std::string_view content_type,
                                                 std::string_view body);

// The request's settings against `model` (a generator): the class, the count, the size checked;
// for an edit the image (the model's size), the mask (the image's) and the rows kept.
absl::StatusOr<GenerateSettings> SettingsFor(const ImagesRequest& request, const ModelInfo& model);

}  // namespace krause::server::openai
