// A JSON document (nlohmann-json's json or ordered_json) as compact text, with any invalid UTF-8
// in it (a client's strings echoed in a message) replaced, never thrown on. Every JSON answer of
// the HTTP front ends is written through this.
// Thread-safety: a pure function.
#pragma once

#include <string>

namespace krause::server {

template <typename Json>
std::string JsonText(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace krause::server
