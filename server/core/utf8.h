// UTF-8 checks for text a client sent that the server echoes (a field's name, a value in an error
// message): protobuf's string fields, JSON and the form fields of RFC 7578 all hold UTF-8, and a
// client's bytes cut to a length can end inside a character.
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace krause::server {

// Whether `text` is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points over
// U+10FFFF).
bool IsUtf8(absl::string_view text);

// `text` with every byte that does not begin a well-formed sequence replaced by U+FFFD; well-formed
// text comes back unchanged.
std::string ValidUtf8(absl::string_view text);

}  // namespace krause::server
