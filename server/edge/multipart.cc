#include "server/edge/multipart.h"

#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace krause::server {
namespace {

// A header value `type; key=value; key="quoted \" value"`: the type and its parameters (keys in
// lower case, values unquoted). nullopt for a malformed one.
struct HeaderValue {
  std::string type;
  std::vector<std::pair<std::string, std::string>> params;
  const std::string* Param(absl::string_view key) const {
    for (const auto& [k, v] : params)
      if (k == key) return &v;
    return nullptr;
  }
};

std::optional<HeaderValue> ParseHeaderValue(absl::string_view s) {
  HeaderValue out;
  size_t at = s.find(';');
  out.type = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(0, at)));
  while (at != absl::string_view::npos && at < s.size()) {
    ++at;  // past ';'
    while (at < s.size() && (s[at] == ' ' || s[at] == '\t')) ++at;
    if (at == s.size()) break;  // a trailing ';'
    const size_t eq = s.find('=', at);
    if (eq == absl::string_view::npos) return std::nullopt;
    std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(at, eq - at)));
    if (key.empty()) return std::nullopt;
    at = eq + 1;
    while (at < s.size() && (s[at] == ' ' || s[at] == '\t')) ++at;
    std::string value;
    if (at < s.size() && s[at] == '"') {  // a quoted string, with backslash escapes
      ++at;
      for (;; ++at) {
        if (at >= s.size()) return std::nullopt;  // unterminated
        if (s[at] == '"') break;
        if (s[at] == '\\' && at + 1 < s.size()) ++at;
        value += s[at];
      }
      ++at;  // past the closing quote
      while (at < s.size() && (s[at] == ' ' || s[at] == '\t')) ++at;
      if (at < s.size() && s[at] != ';') return std::nullopt;
    } else {
      const size_t end = s.find(';', at);
      value = std::string(absl::StripAsciiWhitespace(s.substr(at, end - at)));
      at = end;
      if (at == absl::string_view::npos) at = s.size();
    }
    out.params.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("the multipart/form-data body ", what));
}

}  // namespace

absl::StatusOr<std::string> FormBoundary(absl::string_view content_type) {
  const auto v = ParseHeaderValue(content_type);
  if (!v || v->type != "multipart/form-data")
    return absl::InvalidArgumentError(absl::StrCat(
        "the Content-Type is \"", content_type.substr(0, 80),
        "\"; send multipart/form-data (files as its parts, e.g. curl -F image=@in.png)"));
  const std::string* b = v->Param("boundary");
  // RFC 2046: 1 to 70 characters, not ending in a space.
  if (b == nullptr || b->empty() || b->size() > 70 || b->back() == ' ')
    return absl::InvalidArgumentError(
        "the multipart/form-data Content-Type needs a boundary of 1 to 70 characters");
  return *b;
}

absl::StatusOr<std::vector<FormPart>> ParseMultipartForm(absl::string_view content_type,
                                                         absl::string_view body) {
  auto boundary = FormBoundary(content_type);
  if (!boundary.ok()) return boundary.status();
  // Every delimiter but a first one at the body's start follows a CRLF, which belongs to it.
  const std::string delimiter = absl::StrCat("\r\n--", *boundary);
  size_t at;
  if (absl::StartsWith(body, absl::string_view(delimiter).substr(2))) {
    at = delimiter.size() - 2;
  } else {
    const size_t first = body.find(delimiter);
    if (first == absl::string_view::npos)
      return Bad(absl::StrCat("has no delimiter --", *boundary, " (the Content-Type's boundary)"));
    at = first + delimiter.size();  // the preamble before it is ignored
  }
  std::vector<FormPart> parts;
  for (;;) {
    // After a delimiter: "--" closes the body; else optional padding, then CRLF and a part.
    if (body.substr(at, 2) == "--") return parts;
    while (at < body.size() && (body[at] == ' ' || body[at] == '\t')) ++at;
    if (body.substr(at, 2) != "\r\n")
      return Bad(absl::StrCat("has no line end (CRLF) after the delimiter at byte ", at));
    at += 2;
    if (parts.size() == kMaxFormParts)
      return Bad(absl::StrCat("has over ", kMaxFormParts, " parts"));
    // The part's headers, up to an empty line.
    const size_t head_end =
        body.substr(at, 2) == "\r\n" ? at : body.find("\r\n\r\n", at);  // no headers at all
    if (head_end == absl::string_view::npos || head_end - at > kMaxPartHeaderBytes)
      return Bad(absl::StrCat("has a part whose headers do not end within ", kMaxPartHeaderBytes,
                              " bytes (at byte ", at, ")"));
    FormPart part;
    bool disposition = false;
    for (absl::string_view head = body.substr(at, head_end - at); !head.empty();) {
      const size_t eol = head.find("\r\n");
      const absl::string_view line = head.substr(0, eol);
      head = eol == absl::string_view::npos ? absl::string_view() : head.substr(eol + 2);
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos)
        return Bad(absl::StrCat("has a part header without a colon: \"", line.substr(0, 80), "\""));
      const absl::string_view name = absl::StripAsciiWhitespace(line.substr(0, colon));
      const absl::string_view value = line.substr(colon + 1);
      if (absl::EqualsIgnoreCase(name, "Content-Disposition")) {
        const auto v = ParseHeaderValue(value);
        if (!v || v->type != "form-data" || v->Param("name") == nullptr)
          return Bad(absl::StrCat("has a part whose Content-Disposition is \"",
                                  absl::StripAsciiWhitespace(value).substr(0, 80),
                                  "\"; each part needs form-data; name=\"...\""));
        part.name = *v->Param("name");
        if (const std::string* f = v->Param("filename")) part.filename = *f;
        disposition = true;
      } else if (absl::EqualsIgnoreCase(name, "Content-Type")) {
        part.content_type = std::string(absl::StripAsciiWhitespace(value));
      }  // other headers (Content-Transfer-Encoding, deprecated by RFC 7578) are ignored
    }
    if (!disposition)
      return Bad(
          absl::StrCat("has a part without a Content-Disposition (part ", parts.size() + 1, ")"));
    const size_t data = head_end + 4 - (head_end == at ? 2 : 0);
    const size_t next = body.find(delimiter, data);
    if (next == absl::string_view::npos)
      return Bad(absl::StrCat("ends inside part \"", part.name.substr(0, 64),
                              "\": no closing delimiter --", *boundary, "--"));
    part.data = body.substr(data, next - data);
    parts.push_back(std::move(part));
    at = next + delimiter.size();
  }
}

}  // namespace krause::server
