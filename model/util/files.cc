#include "model/util/files.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace krause {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return ss.str();
}

}  // namespace krause
