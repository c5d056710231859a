#include "server/openai/images_request.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/util/png_pixels.h"
#include "server/core/errors.h"
#include "server/core/utf8.h"
#include "server/edge/json_fields.h"
#include "server/edge/json_text.h"
#include "server/edge/multipart.h"

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

// The parameters of a generation or an edit, from a JSON object (an edit's form fields made one).
absl::StatusOr<ImagesRequest> ParseParameters(const Json& doc, bool edit) {
  ImagesRequest r;
  r.edit = edit;
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
    } else if (name == "user" || (!edit && name == "moderation")) {
      continue;  // accepted and unused
    } else if (edit && name == "input_fidelity") {
      st = OneOf(v, param, {"low", "high"}, "send low or high (a model here has one fidelity)");
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
          param, absl::StrCat("unknown parameter \"", param, "\"; an image ",
                              edit ? "edit takes image, mask, " : "request takes ",
                              "model, prompt, n, size, response_format, output_format, stream, "
                              "partial_images, seed, temperature, top_p, top_k, guidance (and "
                              "user, quality, background, ",
                              edit ? "input_fidelity" : "moderation", ", unused)"));
    }
    if (!st.ok()) return st;
  }
  if (!has_prompt)
    return BadField("prompt", "is required: a class of the model (its label or index), or \"\"");
  if (r.partial_images > 0 && !r.stream) return BadField("partial_images", "needs stream: true");
  return r;
}

// The parameters a form sends as text that the JSON body has as numbers or booleans.
bool IsNumeric(std::string_view name) {
  return name == "n" || name == "partial_images" || name == "seed" || name == "top_k" ||
         name == "temperature" || name == "top_p" || name == "guidance";
}

// A form field's text as the JSON value the parameter takes.
absl::StatusOr<Json> FieldValue(const std::string& name, absl::string_view text) {
  if (IsNumeric(name)) {
    Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_number())
      return BadField(name, absl::StrCat("must be a number, got \"", text.substr(0, 32), "\""));
    return j;
  }
  if (name == "stream") {
    if (text == "true") return Json(true);
    if (text == "false") return Json(false);
    return BadField(name, absl::StrCat("must be true or false, got \"", text.substr(0, 32), "\""));
  }
  return Json(std::string(text));
}

// An edit's image or mask (`param`) must be a PNG of `width` x `height` (`what`: whose size).
absl::Status CheckSize(const std::string& param, const PngInfo& info, int64_t width, int64_t height,
                       const std::string& what) {
  if (info.width == width && info.height == height) return absl::OkStatus();
  return BadField(param, absl::StrCat("is ", info.width, "x", info.height, " but ", what, " ",
                                      width, "x", height, ": send one of that size"));
}

// A PNG that cannot be read, as a refusal naming the parameter.
absl::Status Unreadable(const std::string& param, const absl::Status& why) {
  return BadField(param, absl::StrCat("cannot be read: ", why.message()));
}

// An edit's rows kept: those above the first row with a fully transparent pixel of `alpha`, which
// must start a band of fully transparent rows to the bottom. `param` is the alpha's source.
absl::StatusOr<int64_t> KeptRows(const PixelBuffer& alpha, const std::string& param) {
  const auto at = [&](int64_t y, int64_t x) {
    return static_cast<uint8_t>(alpha.pixels[static_cast<size_t>(y * alpha.width + x)]);
  };
  int64_t first = -1;
  for (int64_t y = 0; y < alpha.height && first < 0; ++y)
    for (int64_t x = 0; x < alpha.width; ++x)
      if (at(y, x) == 0) {
        first = y;
        break;
      }
  if (first < 0)
    return BadField(param, param == "mask"
                               ? "has no fully transparent pixel (alpha 0): nothing to redraw; "
                                 "make the bottom rows to sample transparent"
                               : "has no fully transparent pixel (alpha 0) and no mask was sent: "
                                 "send a mask whose bottom rows are transparent");
  for (int64_t y = first; y < alpha.height; ++y)
    for (int64_t x = 0; x < alpha.width; ++x)
      if (at(y, x) != 0)
        return BadField(
            param, absl::StrCat("is transparent from row ", first, " but not at row ", y,
                                ", column ", x, " (alpha ", at(y, x),
                                "): the transparent region must be a band of whole rows at the "
                                "bottom, since the model draws rows top to bottom and keeps those "
                                "above the band"));
  return first;
}

}  // namespace

absl::StatusOr<ImagesRequest> ParseImagesRequest(std::string_view text) {
  Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return absl::InvalidArgumentError("the body is not valid JSON (send a JSON object)");
  if (!doc.is_object())
    return absl::InvalidArgumentError("the body must be a JSON object (an image request)");
  return ParseParameters(doc, /*edit=*/false);
}

absl::StatusOr<ImagesRequest> ParseImageEditForm(std::string_view content_type,
                                                 std::string_view body) {
  auto parts = ParseMultipartForm(absl::string_view(content_type.data(), content_type.size()),
                                  absl::string_view(body.data(), body.size()));
  if (!parts.ok()) return parts.status();
  Json doc = Json::object();
  std::optional<absl::string_view> image, mask;
  for (const FormPart& part : *parts) {
    if (!IsUtf8(part.name))
      return absl::InvalidArgumentError("a form field's name is not valid UTF-8");
    const std::string name = part.name.substr(0, 64);
    if (name == "image" || name == "image[]" || name == "mask") {
      auto& slot = name == "mask" ? mask : image;
      if (slot)
        return BadField(name == "mask" ? "mask" : "image",
                        "was sent twice: an edit takes one image (and one mask)");
      slot = part.data;
      continue;
    }
    if (doc.contains(name)) return BadField(name, "was sent twice");
    if (!IsUtf8(part.data)) return BadField(name, "is not valid UTF-8 text");
    auto value = FieldValue(name, part.data);
    if (!value.ok()) return value.status();
    doc[name] = *std::move(value);
  }
  auto r = ParseParameters(doc, /*edit=*/true);
  if (!r.ok()) return r.status();
  if (!image) return BadField("image", "is required: the PNG to complete, as a file part");
  r->image = std::string(*image);
  if (mask) {
    if (mask->empty()) return BadField("mask", "is empty: send a PNG, or no mask part");
    r->mask = std::string(*mask);
  }
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
  if (r.edit) {  // a completion of the image: its rows above the mask's transparent band
    // The image's size from its header (the core decodes it as the prompt); the alpha decoded
    // only from the mask, or from the image when there is no mask.
    auto image = ReadPngInfo(r.image);
    if (!image.ok()) return Unreadable("image", image.status());
    if (absl::Status st = CheckSize("image", *image, m.shape.width, m.shape.height,
                                    absl::StrCat("model ", m.name, " draws"));
        !st.ok())
      return st;
    const std::string source = r.mask.empty() ? "image" : "mask";
    bool wrong_size = false;
    auto alpha = DecodePngAlpha(r.mask.empty() ? r.image : r.mask, [&](const PngInfo& info) {
      absl::Status st = CheckSize(source, info, m.shape.width, m.shape.height, "the image is");
      wrong_size = !st.ok();
      return st;
    });
    if (!alpha.ok()) return wrong_size ? alpha.status() : Unreadable(source, alpha.status());
    auto kept = KeptRows(*alpha, source);
    if (!kept.ok()) return kept.status();
    if (*kept > 0) {  // else every row is sampled: a generation
      g.prompt = RequestImage{/*png=*/true, r.image};
      g.prompt_field = "image";
      g.prompt_rows = *kept;
    }
  }
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
