// IDX files (the format of MNIST and Fashion-MNIST), gzip-compressed or not, read without
// LibTorch: the clients and the load generator use these, and the tensor readers in datasets.h
// are built on them. Corrupt or truncated files give DataLoss naming the file.
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace krause {

// Where the Debian package dataset-fashion-mnist installs its files.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Reads a whole file, transparently gunzipping it if it is gzip-compressed.
absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path);

// An IDX array of unsigned bytes: its dimensions (1 to 4) and its elements in row-major order.
struct IdxArray {
  std::vector<int64_t> dims;
  std::string data;  // dims[0] * dims[1] * ... bytes
};

// An IDX file of unsigned bytes (element type 0x08).
absl::StatusOr<IdxArray> ReadIdxArray(const std::string& path);

// The file of an MNIST-style split in `dir`: DIR/{train,t10k}-STEM-ubyte.gz if that exists, else
// the same name without .gz. stem: "images-idx3" or "labels-idx1".
std::string MnistStyleFile(const std::string& dir, bool train, const std::string& stem);

}  // namespace krause
