#include "model/checkpoint/safetensors.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "model/util/status_macros.h"

namespace krause {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct DTypeInfo {
  const char* name;
  at::ScalarType type;
};
constexpr DTypeInfo kDTypes[] = {
    {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"F64", at::kDouble},
    {"I64", at::kLong},  {"I32", at::kInt},  {"U8", at::kByte},       {"BOOL", at::kBool},
};

absl::StatusOr<at::ScalarType> TypeOf(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.type;
  return absl::InvalidArgumentError(absl::StrCat("unsupported safetensors dtype \"", name, "\""));
}

absl::StatusOr<const char*> NameOf(at::ScalarType type) {
  for (const auto& d : kDTypes)
    if (type == d.type) return d.name;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", c10::toString(type), " cannot be stored in safetensors"));
}

}  // namespace

absl::StatusOr<SafetensorsContents> ParseSafetensors(std::string_view bytes) {
  if (bytes.size() < 8) {
    return absl::DataLossError(
        absl::StrCat("safetensors: truncated: ", bytes.size(), " bytes, need at least 8"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8) {
    return absl::DataLossError(absl::StrCat("safetensors: header length ", header_len,
                                            " does not fit the file of ", bytes.size(), " bytes"));
  }
  const std::string_view data = bytes.substr(8 + header_len);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len), nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::DataLossError("safetensors: the header is not a JSON object");
  }
  SafetensorsContents out;
  struct Pending {  // a tensor checked against the file, not yet allocated
    uint64_t begin, nbytes;
    std::string name;
    std::vector<int64_t> shape;
    at::ScalarType type;
  };
  std::vector<Pending> by_offset;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object())
        return absl::DataLossError("safetensors: __metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::DataLossError(
              absl::StrCat("safetensors: __metadata__[\"", m.key(), "\"] is not a string"));
        }
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      return absl::DataLossError(
          absl::StrCat("safetensors: tensor \"", name, "\" needs dtype, shape and data_offsets"));
    }
    ASSIGN_OR_RETURN(const at::ScalarType type, TypeOf(entry["dtype"].get<std::string>()));
    // Sizes are checked against the file before anything is allocated: no product may wrap, and
    // a tensor's bytes must be its data range, which lies within the file.
    if (entry["shape"].size() > 64)
      return absl::DataLossError(absl::StrCat("safetensors: tensor \"", name, "\" has ",
                                              entry["shape"].size(), " dimensions (at most 64)"));
    std::vector<int64_t> shape;
    uint64_t nbytes = c10::elementSize(type);
    bool wraps = false, zero = false;
    for (const auto& s : entry["shape"]) {
      if (!s.is_number_unsigned() || s.get<uint64_t>() > (uint64_t{1} << 48)) {
        return absl::DataLossError(absl::StrCat("safetensors: tensor \"", name, "\": bad shape"));
      }
      const uint64_t dim = s.get<uint64_t>();
      shape.push_back(static_cast<int64_t>(dim));
      zero = zero || dim == 0;
      wraps = wraps || __builtin_mul_overflow(nbytes, dim, &nbytes);
    }
    if (zero) {
      nbytes = 0;
      wraps = false;
    }
    const auto& offs = entry["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return absl::DataLossError(absl::StrCat("safetensors: tensor \"", name, "\": bad offsets"));
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end > data.size()) {
      return absl::DataLossError(absl::StrCat("safetensors: tensor \"", name, "\" data [", begin,
                                              ", ", end, ") lies outside the ", data.size(),
                                              " data bytes (truncated file?)"));
    }
    if (wraps || end - begin != nbytes) {
      return absl::DataLossError(absl::StrCat("safetensors: tensor \"", name, "\" has ",
                                              end - begin, " bytes, but shape x dtype needs ",
                                              wraps ? "over 2^64" : absl::StrCat(nbytes)));
    }
    by_offset.push_back({begin, nbytes, name, std::move(shape), type});
  }
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const Pending& a, const Pending& b) { return a.begin < b.begin; });
  // The data is indexed entirely, without overlaps or holes (the format's rule): each tensor
  // starts where the previous one ends. Checked before any allocation, so the tensors together
  // never take more than the file's bytes.
  uint64_t expect = 0;
  for (const Pending& p : by_offset) {
    if (p.begin != expect)
      return absl::DataLossError(absl::StrCat(
          "safetensors: tensor \"", p.name, "\" starts at data byte ", p.begin, ", but ",
          p.begin < expect ? "the previous tensor ends at " : "the data before it ends at ", expect,
          p.begin < expect ? " (overlapping tensors)" : " (a hole)"));
    expect = p.begin + p.nbytes;
  }
  if (expect != data.size())
    return absl::DataLossError(absl::StrCat("safetensors: the tensors cover ", expect, " of the ",
                                            data.size(), " data bytes"));
  try {
    for (const Pending& p : by_offset) {
      at::Tensor t = at::empty(p.shape, at::TensorOptions().dtype(p.type));
      if (p.nbytes > 0) std::memcpy(t.data_ptr(), data.data() + p.begin, p.nbytes);
      out.tensors.push_back({p.name, std::move(t)});
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("safetensors: ", e.what()));
  }
  return out;
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  auto parsed = ParseSafetensors(ss.str());
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      return absl::InvalidArgumentError("tensor name __metadata__ is reserved");
    if (header.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name \"", name, "\" appears twice"));
    }
    ASSIGN_OR_RETURN(const char* dtype, NameOf(t.scalar_type()));
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = c.numel() * c.element_size();
    header[name] = {
        {"dtype", dtype}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    contiguous.push_back(c);
  }
  std::string head = header.dump();
  while ((head.size() + 8) % 8 != 0) head.push_back(' ');
  std::string out;
  out.reserve(8 + head.size() + offset);
  const uint64_t len = head.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += head;
  for (const at::Tensor& c : contiguous) {
    out.append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(const std::string bytes, SerializeSafetensors(tensors, metadata));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) return absl::DataLossError(absl::StrCat("short write to ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace krause
