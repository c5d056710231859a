#include "server/web/web_ui.h"

#include <cstdint>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/web/web_assets.h"

namespace krause::server {
namespace {

std::string ContentTypeOf(absl::string_view name) {
  if (absl::EndsWith(name, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(name, ".js")) return "text/javascript; charset=utf-8";
  if (absl::EndsWith(name, ".css")) return "text/css; charset=utf-8";
  if (absl::EndsWith(name, ".svg")) return "image/svg+xml";
  if (absl::EndsWith(name, ".png")) return "image/png";
  return "application/octet-stream";
}

// FNV-1a, 64 bits: the ETag of a file (it changes with the file, and so with each build that
// changes the page).
uint64_t Fnv1a(const unsigned char* data, size_t size) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

}  // namespace

WebUi::WebUi() {
  for (int i = 0; i < kWebAssetCount; ++i) {
    const WebAsset& a = kWebAssets[i];
    files_.push_back({a.name, ContentTypeOf(a.name),
                      absl::StrFormat("\"%016x\"", Fnv1a(a.data, a.size)), a.data, a.size});
  }
}

size_t WebUi::bytes() const {
  size_t n = 0;
  for (const File& f : files_) n += f.size;
  return n;
}

bool WebUi::Serve(const HttpRequest& request, const std::shared_ptr<HttpExchange>& ex) const {
  const std::string path = request.target.substr(0, request.target.find('?'));
  std::string name;
  if (path == "/" || path == "/index.html") {
    name = "index.html";
  } else if (absl::StartsWith(path, "/ui/")) {
    name = path.substr(4);
  } else {
    return false;
  }
  if (request.method != "GET") {
    ex->Reply({405, {{"Allow", "GET"}, {"Content-Type", "text/plain"}}, "use GET\n"});
    return true;
  }
  for (const File& f : files_) {
    if (f.name != name) continue;
    HttpHeaders headers = {
        {"Content-Type", f.content_type},
        {"ETag", f.etag},
        {"Cache-Control", "no-cache"},  // revalidate: a new server's page replaces the old
        {"X-Content-Type-Options", "nosniff"},
        {"Content-Security-Policy",
         "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
         "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"},
    };
    if (request.Header("If-None-Match") == f.etag) {
      ex->Reply({304, std::move(headers), ""});
      return true;
    }
    ex->Reply(
        {200, std::move(headers), std::string(reinterpret_cast<const char*>(f.data), f.size)});
    return true;
  }
  ex->Reply({404,
             {{"Content-Type", "text/plain"}},
             absl::StrCat("no such file: ", name.substr(0, 128), "\n")});
  return true;
}

std::vector<HttpRoute> WebUi::Routes() const {
  std::vector<HttpRoute> out;
  for (const auto& [path, exact] : {std::pair{"/", true}, {"/index.html", true}, {"/ui/", false}}) {
    HttpRoute r;
    r.prefix = path;
    r.exact = exact;
    r.protocol = "web";
    r.handler = [this](HttpRequest request, std::shared_ptr<HttpExchange> ex) {
      Serve(request, ex);
    };
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace krause::server
