#include "server/v1/generate_body.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/defaults.h"
#include "server/core/errors.h"
#include "server/edge/json_fields.h"
#include "server/edge/json_text.h"

namespace krause::server {
namespace {

using Json = nlohmann::json;

}  // namespace

absl::StatusOr<GenerateSettings> ParseGenerateBody(std::string_view text) {
  Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return absl::InvalidArgumentError("the body is not valid JSON (send a JSON object)");
  if (!doc.is_object())
    return absl::InvalidArgumentError("the body must be a JSON object of generation settings");
  // Settings at the top level, or in "parameters" (the generate extension's habit).
  Json fields = Json::object();
  for (auto& [name, value] : doc.items()) {
    if (name != "parameters") {
      fields[name] = value;
      continue;
    }
    if (!value.is_object()) return BadField("parameters", "must be an object");
    for (auto& [pname, pvalue] : value.items()) {
      if (doc.contains(pname))
        return BadField(pname.substr(0, 64), "is given twice (at the top and in parameters)");
      fields[pname] = pvalue;
    }
  }
  GenerateSettings b;
  b.prompt_field = "prompt_png";
  for (const auto& [name, v] : fields.items()) {
    const char* f = name.c_str();
    if (name == "num_images") {
      auto n = JsonIntegerIn(v, f, 0, std::numeric_limits<int32_t>::max());
      if (!n.ok()) return n.status();
      b.num_images = *n;
    } else if (name == "seed") {
      auto s = JsonUnsigned(v, f);
      if (!s.ok()) return s.status();
      b.seed = *s;
    } else if (name == "temperature" || name == "top_p" || name == "guidance") {
      auto x = JsonNumber(v, f);
      if (!x.ok()) return x.status();
      (name == "temperature" ? b.temperature : name == "top_p" ? b.top_p : b.guidance) = *x;
    } else if (name == "top_k") {
      auto k = JsonIntegerIn(v, f, 0, std::numeric_limits<int32_t>::max());
      if (!k.ok()) return k.status();
      b.top_k = *k;
    } else if (name == "label") {
      if (!v.is_string()) return BadField(f, "must be a string (one of the model's labels)");
      b.label = v.get<std::string>();
    } else if (name == "class_index") {
      auto c = JsonIntegerIn(v, f, 0, std::numeric_limits<int32_t>::max());
      if (!c.ok()) return c.status();
      b.class_index = *c;
    } else if (name == "prompt_png") {
      if (!v.is_string()) return BadField(f, "must be a string (a base64 PNG)");
      absl::string_view s = v.get_ref<const std::string&>();
      if (absl::StartsWith(s, "data:")) {  // a data: URL, as a browser's canvas gives it
        const size_t comma = s.find(',');
        if (comma == absl::string_view::npos || !absl::StrContains(s.substr(0, comma), ";base64"))
          return BadField(f, "is a data: URL but not a base64 one");
        s.remove_prefix(comma + 1);
      }
      std::string png;
      if (!absl::Base64Unescape(s, &png)) return BadField(f, "is not valid base64");
      RequestImage im;
      im.bytes = std::move(png);
      b.prompt = std::move(im);
    } else if (name == "prompt_rows") {
      auto r = JsonIntegerIn(v, f, 0, std::numeric_limits<int32_t>::max());
      if (!r.ok()) return r.status();
      b.prompt_rows = *r;
    } else if (name == "update_interval_ms") {
      auto r = JsonIntegerIn(v, f, 0, std::numeric_limits<int32_t>::max());
      if (!r.ok()) return r.status();
      b.update_interval_ms = *r;
    } else if (name == "stream_rows") {
      if (!v.is_boolean()) return BadField(f, "must be true or false");
      b.stream_rows = v.get<bool>();
    } else if (name == "first_image") {
      auto s = JsonUnsigned(v, f);
      if (!s.ok()) return s.status();
      b.first_image = *s;
    } else if (name == "priority") {
      auto p = JsonIntegerIn(v, f, 0, std::numeric_limits<int32_t>::max());
      if (!p.ok()) return p.status();
      b.priority = *p;
    } else if (name == "timeout") {
      auto t = JsonIntegerIn(v, f, 0, defaults::kMaxTimeoutMicroseconds);
      if (!t.ok()) return t.status();
      b.timeout_us = *t;
    } else {
      return InvalidField(
          name.substr(0, 64),
          absl::StrCat("unknown setting \"", name.substr(0, 64),
                       "\"; the settings are num_images, seed, temperature, top_p, top_k, "
                       "guidance, label, class_index, prompt_png, prompt_rows, "
                       "update_interval_ms, stream_rows, first_image, timeout, priority"));
    }
  }
  if (b.label && b.class_index)
    return BadField("label", "and class_index: give at most one of the two");
  return b;
}

}  // namespace krause::server
