#include "model/data/idx.h"

#include <zlib.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace krause {

absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string out;
  char buf[1 << 16];
  while (true) {
    const int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      return absl::DataLossError(absl::StrCat(path, ": corrupt compressed data (", msg, ")"));
    }
    if (n == 0) break;
    out.append(buf, n);
  }
  int err = 0;
  const char* msg = gzerror(f, &err);
  const std::string message = msg ? msg : "";
  gzclose(f);
  if (err != Z_OK && err != Z_STREAM_END) {
    return absl::DataLossError(absl::StrCat(path, ": ", message));
  }
  return out;
}

namespace {

uint32_t BigEndian32(const std::string& b, size_t at) {
  return (uint32_t{static_cast<uint8_t>(b[at])} << 24) |
         (uint32_t{static_cast<uint8_t>(b[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(b[at + 2])} << 8) |
         uint32_t{static_cast<uint8_t>(b[at + 3])};
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxArray(const std::string& path) {
  absl::StatusOr<std::string> read = ReadMaybeGzip(path);
  if (!read.ok()) return read.status();
  std::string& bytes = *read;
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0) {
    return absl::DataLossError(absl::StrCat(path, ": not an IDX file (bad magic)"));
  }
  if (static_cast<uint8_t>(bytes[2]) != 0x08) {
    return absl::DataLossError(absl::StrCat(path, ": IDX element type 0x",
                                            absl::Hex(static_cast<uint8_t>(bytes[2])),
                                            " is not unsigned byte (0x08)"));
  }
  const int dims = static_cast<uint8_t>(bytes[3]);
  if (dims < 1 || dims > 4 || bytes.size() < 4 + 4 * static_cast<size_t>(dims)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated IDX header"));
  }
  IdxArray a;
  uint64_t numel = 1;
  for (int i = 0; i < dims; ++i) {
    a.dims.push_back(BigEndian32(bytes, 4 + 4 * i));
    numel *= a.dims.back();
  }
  const size_t offset = 4 + 4 * dims;
  if (bytes.size() - offset != numel) {
    return absl::DataLossError(absl::StrCat(path, ": IDX data has ", bytes.size() - offset,
                                            " bytes, the header says ", numel, " (truncated?)"));
  }
  bytes.erase(0, offset);
  a.data = std::move(bytes);
  return a;
}

std::string MnistStyleFile(const std::string& dir, bool train, const std::string& stem) {
  const std::string plain = absl::StrCat(dir, "/", train ? "train" : "t10k", "-", stem, "-ubyte");
  std::ifstream gz(plain + ".gz");
  return gz.good() ? plain + ".gz" : plain;
}

}  // namespace krause
