#include "client/http_get.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace krause::client {
namespace {

// Parses `name{a="x",b="y"} value` (labels optional). False on comments and malformed lines.
bool ParseSample(const std::string& line, std::string* name,
                 std::map<std::string, std::string>* labels, double* value) {
  if (line.empty() || line[0] == '#') return false;
  labels->clear();
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  *name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return false;
      const std::string key = line.substr(i, eq - i);
      std::string v;
      size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) ++j;
        v += line[j];
      }
      (*labels)[key] = v;
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    ++i;
  }
  while (i < line.size() && line[i] == ' ') ++i;
  if (i >= line.size()) return false;
  char* end = nullptr;
  *value = std::strtod(line.c_str() + i, &end);
  return end != line.c_str() + i;
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    double timeout_seconds) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("expected host:port, got ", host_port));
  const std::string host = host_port.substr(0, colon), port = host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr)
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host_port));
  int fd = -1;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout_seconds);
    tv.tv_usec = static_cast<suseconds_t>((timeout_seconds - static_cast<double>(tv.tv_sec)) * 1e6);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot connect to ", host_port));
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\nConnection: close\r\n\r\n");
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot send to ", host_port));
  }
  std::string resp;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat("reading from ", host_port, " timed out"));
    }
    if (n == 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t header_end = resp.find("\r\n\r\n");
  const std::string status_line = resp.substr(0, resp.find("\r\n"));
  if (header_end == std::string::npos || status_line.find(" 200") == std::string::npos)
    return absl::UnavailableError(absl::StrCat("GET ", path, " from ", host_port, ": ",
                                               status_line.empty() ? "no response" : status_line));
  return resp.substr(header_end + 4);
}

absl::StatusOr<double> PrometheusSample(const std::string& text, const std::string& name,
                                        const std::map<std::string, std::string>& labels) {
  std::istringstream in(text);
  std::string line, n;
  std::map<std::string, std::string> l;
  double v;
  while (std::getline(in, line)) {
    if (ParseSample(line, &n, &l, &v) && n == name && l == labels) return v;
  }
  return absl::NotFoundError(absl::StrCat("no sample ", name));
}

double PrometheusSum(const std::string& text, const std::string& name,
                     const std::map<std::string, std::string>& labels) {
  std::istringstream in(text);
  std::string line, n;
  std::map<std::string, std::string> l;
  double v, sum = 0;
  while (std::getline(in, line)) {
    if (!ParseSample(line, &n, &l, &v) || n != name) continue;
    bool match = true;
    for (const auto& [k, want] : labels) {
      const auto it = l.find(k);
      match = match && it != l.end() && it->second == want;
    }
    if (match) sum += v;
  }
  return sum;
}

}  // namespace krause::client
