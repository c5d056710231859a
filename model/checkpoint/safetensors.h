// safetensors read and write (the public format: 8-byte little-endian header length N, N bytes of
// JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
// then the raw little-endian tensor data). Supported dtypes: F32, F16, BF16, F64, I64, I32, U8,
// BOOL. Model configs travel as strings in __metadata__.
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace krause {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafetensorsContents {
  NamedTensors tensors;  // in the order of their data in the file
  std::map<std::string, std::string> metadata;
};

// Parses a whole file's bytes. Errors (InvalidArgument / DataLoss) say what is wrong and where:
// truncated file, header length out of range, bad JSON, unknown dtype, offsets outside the data
// or not matching shape x dtype size.
absl::StatusOr<SafetensorsContents> ParseSafetensors(std::string_view bytes);
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

// Serialises CPU-copyable tensors with their own dtypes (convert before calling to store fp16).
absl::StatusOr<std::string> SerializeSafetensors(
    const NamedTensors& tensors, const std::map<std::string, std::string>& metadata);
// Writes atomically (to path + ".tmp", then rename).
absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace krause
