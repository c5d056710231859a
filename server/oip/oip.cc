#include "server/oip/oip.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#ifndef KRAUSE_VERSION
#define KRAUSE_VERSION "unknown"
#endif

namespace krause::server::oip {
namespace {

struct TypeRow {
  DataType type;
  const char* name;
  int64_t bytes;
};
constexpr TypeRow kTypes[] = {
    {DataType::kBool, "BOOL", 1},     {DataType::kUint8, "UINT8", 1},
    {DataType::kUint16, "UINT16", 2}, {DataType::kUint32, "UINT32", 4},
    {DataType::kUint64, "UINT64", 8}, {DataType::kInt8, "INT8", 1},
    {DataType::kInt16, "INT16", 2},   {DataType::kInt32, "INT32", 4},
    {DataType::kInt64, "INT64", 8},   {DataType::kFp16, "FP16", 2},
    {DataType::kFp32, "FP32", 4},     {DataType::kFp64, "FP64", 8},
    {DataType::kBf16, "BF16", 2},     {DataType::kBytes, "BYTES", 0},
};

constexpr int64_t kMaxElements = int64_t{1} << 40;

}  // namespace

const char* ServerVersion() { return KRAUSE_VERSION; }

absl::StatusOr<DataType> ParseDataType(absl::string_view name, absl::string_view field) {
  for (const TypeRow& r : kTypes)
    if (name == r.name) return r.type;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unknown datatype \"", name.substr(0, 32),
      "\" (the protocol's are BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64, BF16, BYTES)"));
}

const char* DataTypeName(DataType type) {
  for (const TypeRow& r : kTypes)
    if (r.type == type) return r.name;
  return "?";
}

int64_t ElementBytes(DataType type) {
  for (const TypeRow& r : kTypes)
    if (r.type == type) return r.bytes;
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape, absl::string_view field) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", ShapeString(shape), " has a negative dimension"));
    if (d != 0 && n > kMaxElements / d)
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", ShapeString(shape), " has over 2^40 elements"));
    n *= d;
  }
  return n;
}

absl::Status CheckContents(const Tensor& t) {
  const std::string field = absl::StrCat("input ", t.name);
  auto count = ElementCount(t.shape, field);
  if (!count.ok()) return count.status();
  const int64_t size = ElementBytes(t.datatype);
  if (size > 0) {
    if (static_cast<int64_t>(t.data.size()) != *count * size)
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", t.data.size(), " bytes of data, but ", DataTypeName(t.datatype),
                       " ", ShapeString(t.shape), " needs ", *count * size));
    return absl::OkStatus();
  }
  int64_t elements = 0;
  size_t at = 0;
  while (at < t.data.size()) {
    if (t.data.size() - at < 4)
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": BYTES element ", elements, " is cut off in its 4-byte length"));
    uint32_t len;
    std::memcpy(&len, t.data.data() + at, 4);  // little-endian hosts only (x86-64, aarch64)
    at += 4;
    if (len > t.data.size() - at)
      return absl::InvalidArgumentError(absl::StrCat(field, ": BYTES element ", elements, " says ",
                                                     len, " bytes but ", t.data.size() - at,
                                                     " are left"));
    at += len;
    ++elements;
  }
  if (elements != *count)
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", elements,
                                                   " BYTES elements, but shape ",
                                                   ShapeString(t.shape), " needs ", *count));
  return absl::OkStatus();
}

std::vector<std::string_view> BytesElements(const Tensor& t) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at + 4 <= t.data.size()) {
    uint32_t len;
    std::memcpy(&len, t.data.data() + at, 4);
    at += 4;
    if (len > t.data.size() - at) break;
    out.emplace_back(t.data.data() + at, len);
    at += len;
  }
  return out;
}

void AppendBytesElement(std::string_view element, std::string* data) {
  const uint32_t len = static_cast<uint32_t>(element.size());
  data->append(reinterpret_cast<const char*>(&len), 4);
  data->append(element.data(), element.size());
}

std::vector<std::string> Extensions() {
  return {"binary_tensor_data", "classification", "model_repository", "statistics"};
}

const char* ParameterTypeName(const Parameter& p) {
  switch (p.index()) {
    case 0:
      return "bool";
    case 1:
      return "int64";
    case 2:
      return "uint64";
    case 3:
      return "double";
    default:
      return "string";
  }
}

absl::StatusOr<double> NumberParameter(const std::string& name, const Parameter& p) {
  if (const auto* v = std::get_if<int64_t>(&p)) return static_cast<double>(*v);
  if (const auto* v = std::get_if<uint64_t>(&p)) return static_cast<double>(*v);
  if (const auto* v = std::get_if<double>(&p)) {
    if (std::isfinite(*v)) return *v;
    return absl::InvalidArgumentError(absl::StrCat("parameter ", name, " is not finite"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameter ", name, " must be a number, got a ", ParameterTypeName(p)));
}

absl::StatusOr<int64_t> IntegerParameter(const std::string& name, const Parameter& p) {
  if (const auto* v = std::get_if<int64_t>(&p)) return *v;
  if (const auto* v = std::get_if<uint64_t>(&p)) {
    if (*v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return static_cast<int64_t>(*v);
    return absl::InvalidArgumentError(absl::StrCat("parameter ", name, " is over 2^63 - 1"));
  }
  if (const auto* v = std::get_if<double>(&p)) {
    if (std::isfinite(*v) && std::floor(*v) == *v && std::fabs(*v) < 9.007199254740992e15)
      return static_cast<int64_t>(*v);
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", name, " must be a whole number, got ", *v));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameter ", name, " must be an integer, got a ", ParameterTypeName(p)));
}

}  // namespace krause::server::oip
