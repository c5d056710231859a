// A multipart/form-data body (RFC 7578 over RFC 2046's multipart syntax) split into its parts:
// what HTML forms, curl -F and the SDKs' file uploads send (OpenAI's /v1/images/edits takes one).
// The boundary comes from the Content-Type header; each part's name, filename and Content-Type
// from its headers. Strict where clients agree (CRLF line ends, a Content-Disposition of
// form-data with a name on every part, a closing delimiter) and bounded (kMaxFormParts parts,
// kMaxPartHeaderBytes of headers each); every refusal is InvalidArgument saying what was wrong
// and where. The parts' data are views into the body, which must outlive them.
// Thread-safety: a pure function.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace krause::server {

inline constexpr size_t kMaxFormParts = 64;
inline constexpr size_t kMaxPartHeaderBytes = 8192;

struct FormPart {
  std::string name;          // Content-Disposition's name
  std::string filename;      // its filename (a file upload), or ""
  std::string content_type;  // the part's Content-Type, or ""
  absl::string_view data;    // the content, a view into the body
};

// The boundary of a `multipart/form-data; boundary=...` Content-Type (quoted or not).
absl::StatusOr<std::string> FormBoundary(absl::string_view content_type);

// The parts, in the body's order. `content_type` is the request's Content-Type header.
absl::StatusOr<std::vector<FormPart>> ParseMultipartForm(absl::string_view content_type,
                                                         absl::string_view body);

}  // namespace krause::server
