#include "server/openai/images_request.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/errors.h"
#include "server/edge/json_fields.h"
#include "server/edge/json_text.h"

namespace krause::server::openai {
namespace {

using Json = nlohmann::json;

// One of `allowed`; `why` says what the others would need.
absl::Status OneOf(const Json& j, const std::string& param,
                   std::initializer_list<const char*> allowed, const std::string& why) {
  if (j.is_null()) return absl::OkStatus();  // the SDKs send null for "unset"
  auto s = JsonString(j, param);
  if (!s.ok()) return s.status();
  for (const char* a : allowed)
    if (*s == a) return absl::OkStatus();
  return BadField(param, absl::StrCat("\"", s->substr(0, 64), "\" is not supported here: ", why));
}

}  // namespace

absl::StatusOr<ImagesRequest> ParseImagesRequest(std::string_view text) {
  Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return absl::InvalidArgumentError("the body is not valid JSON (send a JSON object)");
  if (!doc.is_object())
    return absl::InvalidArgumentError("the body must be a JSON object (an image request)");
  ImagesRequest r;
  bool has_prompt = false;
  for (const auto& [name, v] : doc.items()) {
    const std::string param = name.substr(0, 64);
    absl::Status st;
    if (name == "model") {
      if (v.is_null()) continue;
      auto s = JsonString(v, param);
      if (!s.ok()) return s.status();
      r.model = *s;
    } else if (name == "prompt") {
      auto s = JsonString(v, param);
      if (!s.ok()) return s.status();
      r.prompt = *s;
      has_prompt = true;
    } else if (name == "n") {
      if (v.is_null()) continue;
      auto n = JsonIntegerIn(v, param, 1, std::numeric_limits<int32_t>::max());
      if (!n.ok()) return n.status();
      r.n = *n;
    } else if (name == "size") {
      if (v.is_null()) continue;
      auto s = JsonString(v, param);
      if (!s.ok()) return s.status();
      r.size = *s;
    } else if (name == "response_format") {
      st = OneOf(v, param, {"b64_json"},
                 "this server keeps no images to link to; the images come back as b64_json");
    } else if (name == "output_format") {
      st = OneOf(v, param, {"png"}, "the images are PNG (lossless, as the model drew them)");
    } else if (name == "quality") {
      st = OneOf(v, param, {"auto", "standard"}, "a model here has one quality");
    } else if (name == "background") {
      st = OneOf(v, param, {"auto", "opaque"}, "the images have no alpha channel");
    } else if (name == "user" || name == "moderation") {
      continue;  // accepted and unused
    } else if (name == "stream") {
      if (v.is_null()) continue;
      if (!v.is_boolean()) return BadField(param, "must be true or false");
      r.stream = v.get<bool>();
    } else if (name == "partial_images") {
      if (v.is_null()) continue;
      auto p = JsonIntegerIn(v, param, 0, 3);
      if (!p.ok()) return p.status();
      r.partial_images = *p;
    } else if (name == "seed") {
      auto seed = JsonUnsigned(v, param);
      if (!seed.ok()) return seed.status();
      r.settings.seed = *seed;
    } else if (name == "temperature" || name == "top_p" || name == "guidance") {
      auto x = JsonNumber(v, param);
      if (!x.ok()) return x.status();
      (name == "temperature" ? r.settings.temperature
       : name == "top_p"     ? r.settings.top_p
                             : r.settings.guidance) = *x;
    } else if (name == "top_k") {
      auto k = JsonIntegerIn(v, param, 0, std::numeric_limits<int32_t>::max());
      if (!k.ok()) return k.status();
      r.settings.top_k = *k;
    } else {
      return InvalidField(
          param, absl::StrCat("unknown parameter \"", param,
                              "\"; an image request takes model, prompt, n, size, "
                              "response_format, output_format, stream, partial_images, seed, "
                              "temperature, top_p, top_k, guidance (and user, quality, "
                              "background, moderation, unused)"));
    }
    if (!st.ok()) return st;
  }
  if (!has_prompt)
    return BadField("prompt", "is required: a class of the model (its label or index), or \"\"");
  if (r.partial_images > 0 && !r.stream) return BadField("partial_images", "needs stream: true");
  return r;
}

absl::StatusOr<GenerateSettings> SettingsFor(const ImagesRequest& r, const ModelInfo& m) {
  GenerateSettings g = r.settings;
  g.answer_once = true;
  if (r.n < 1 || r.n > m.max_images_per_request)
    return BadField("n", absl::StrCat("must be in [1, ", m.max_images_per_request, "] for model ",
                                      m.name, ", got ", r.n));
  g.num_images = r.n;
  const std::string own = absl::StrCat(m.shape.width, "x", m.shape.height);
  if (r.size != "auto" && r.size != own)
    return BadField(
        "size", absl::StrCat("is \"", r.size.substr(0, 32), "\" but model ", m.name, " draws ", own,
                             " images: send \"", own, "\" or \"auto\""));
  const std::string prompt(absl::StripAsciiWhitespace(r.prompt));
  if (prompt.empty()) return g;  // unconditional
  if (m.classes == 0)
    return BadField("prompt", absl::StrCat("names a class, but model ", m.name,
                                           " is unconditional: send \"\""));
  for (size_t i = 0; i < m.labels.size(); ++i) {
    if (absl::EqualsIgnoreCase(m.labels[i], prompt)) {
      g.class_index = static_cast<int64_t>(i);
      return g;
    }
  }
  int64_t index;
  if (absl::SimpleAtoi(prompt, &index) && index >= 0 && index < m.classes) {
    g.class_index = index;
    return g;
  }
  return BadField(
      "prompt",
      absl::StrCat("\"", prompt.substr(0, 64), "\" is not a class of model ", m.name,
                   m.labels.empty()
                       ? absl::StrCat("; give an index in [0, ", m.classes, ")")
                       : absl::StrCat("; its classes are ", absl::StrJoin(m.labels, ", "))));
}

}  // namespace krause::server::openai
