#include "server/oip/oip_json.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "server/edge/json_text.h"

namespace krause::server::oip {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::StatusOr<Parameters> ParametersOf(const Json& j, const std::string& field) {
  Parameters out;
  if (j.is_null()) return out;
  if (!j.is_object()) return Bad(field, "must be an object");
  for (const auto& [name, v] : j.items()) {
    if (v.is_boolean()) {
      out[name] = v.get<bool>();
    } else if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        out[name] = static_cast<int64_t>(u);
      } else {
        out[name] = u;
      }
    } else if (v.is_number_integer()) {
      out[name] = v.get<int64_t>();
    } else if (v.is_number_float()) {
      out[name] = v.get<double>();
    } else if (v.is_string()) {
      out[name] = v.get<std::string>();
    } else {
      return Bad(absl::StrCat(field, ".", name.substr(0, 64)),
                 "a parameter must be a bool, a number or a string");
    }
  }
  return out;
}

// Appends the elements of `data` (nested arrays flattened, row-major) to t->data.
class Flattener {
 public:
  Flattener(Tensor* t, std::string field) : t_(t), field_(std::move(field)) {}

  absl::Status Add(const Json& j, int depth) {
    if (j.is_array()) {
      if (depth > 16) return Bad(field_, "data is nested more than 16 deep");
      for (const Json& e : j)
        if (absl::Status st = Add(e, depth + 1); !st.ok()) return st;
      return absl::OkStatus();
    }
    return Element(j);
  }
  int64_t count() const { return count_; }

 private:
  template <typename T>
  absl::Status Integer(const Json& j) {
    T x;
    if (j.is_number_unsigned()) {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return OutOfRange(j);
      x = static_cast<T>(u);
    } else if (j.is_number_integer()) {
      const int64_t v = j.get<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (v < 0) return OutOfRange(j);
        if (static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))
          return OutOfRange(j);
      } else {
        if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
          return OutOfRange(j);
      }
      x = static_cast<T>(v);
    } else {
      return WrongType(j);
    }
    t_->data.append(reinterpret_cast<const char*>(&x), sizeof(T));
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Float(const Json& j) {
    if (!j.is_number()) return WrongType(j);
    const T x = static_cast<T>(j.get<double>());
    t_->data.append(reinterpret_cast<const char*>(&x), sizeof(T));
    return absl::OkStatus();
  }
  absl::Status OutOfRange(const Json& j) {
    return Bad(field_, absl::StrCat("element ", count_, " (", JsonText(j).substr(0, 32),
                                    ") does not fit ", DataTypeName(t_->datatype)));
  }
  absl::Status WrongType(const Json& j) {
    return Bad(field_, absl::StrCat("element ", count_, " is a JSON ", j.type_name(), ", not a ",
                                    DataTypeName(t_->datatype), " value"));
  }
  absl::Status Element(const Json& j) {
    absl::Status st;
    switch (t_->datatype) {
      case DataType::kBool:
        if (!j.is_boolean()) return WrongType(j);
        t_->data.push_back(j.get<bool>() ? 1 : 0);
        break;
      case DataType::kUint8:
        st = Integer<uint8_t>(j);
        break;
      case DataType::kUint16:
        st = Integer<uint16_t>(j);
        break;
      case DataType::kUint32:
        st = Integer<uint32_t>(j);
        break;
      case DataType::kUint64:
        st = Integer<uint64_t>(j);
        break;
      case DataType::kInt8:
        st = Integer<int8_t>(j);
        break;
      case DataType::kInt16:
        st = Integer<int16_t>(j);
        break;
      case DataType::kInt32:
        st = Integer<int32_t>(j);
        break;
      case DataType::kInt64:
        st = Integer<int64_t>(j);
        break;
      case DataType::kFp32:
        st = Float<float>(j);
        break;
      case DataType::kFp64:
        st = Float<double>(j);
        break;
      case DataType::kBytes:
        if (!j.is_string()) return WrongType(j);
        AppendBytesElement(j.get_ref<const std::string&>(), &t_->data);
        break;
      case DataType::kFp16:
      case DataType::kBf16:
        return Bad(field_, absl::StrCat(DataTypeName(t_->datatype), " cannot be sent as JSON"));
    }
    if (!st.ok()) return st;
    ++count_;
    return absl::OkStatus();
  }

  Tensor* const t_;
  const std::string field_;
  int64_t count_ = 0;
};

// The binary part of a body (the binary tensor data extension): what follows the JSON, handed
// out in the order of the inputs that have a binary_data_size.
struct BinaryPart {
  absl::string_view bytes;
  bool present = false;  // the request has the Inference-Header-Content-Length header
  size_t taken = 0;
};

absl::StatusOr<Tensor> InputOf(const Json& j, size_t index, BinaryPart* binary) {
  std::string field = absl::StrCat("inputs[", index, "]");
  if (!j.is_object()) return Bad(field, "must be an object");
  Tensor t;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return Bad(field, "needs a string \"name\"");
  t.name = name->get<std::string>();
  field = absl::StrCat("input ", t.name.substr(0, 64));
  for (const auto& [key, v] : j.items()) {
    if (key != "name" && key != "shape" && key != "datatype" && key != "parameters" &&
        key != "data")
      return Bad(field, absl::StrCat("unknown field \"", key.substr(0, 32), "\""));
  }
  const auto datatype = j.find("datatype");
  if (datatype == j.end() || !datatype->is_string())
    return Bad(field, "needs a string \"datatype\"");
  auto type = ParseDataType(datatype->get_ref<const std::string&>(), field);
  if (!type.ok()) return type.status();
  t.datatype = *type;
  const auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array()) return Bad(field, "needs a \"shape\" array");
  for (const Json& d : *shape) {
    if (!d.is_number_integer()) return Bad(field, "shape must hold integers");
    t.shape.push_back(d.get<int64_t>());
  }
  auto count = ElementCount(t.shape, field);
  if (!count.ok()) return count.status();
  std::optional<int64_t> binary_size;
  if (const auto p = j.find("parameters"); p != j.end()) {
    auto params = ParametersOf(*p, absl::StrCat(field, ".parameters"));
    if (!params.ok()) return params.status();
    for (const auto& [pname, value] : *params) {
      if (pname != "binary_data_size")
        return Bad(field, absl::StrCat("unknown parameter \"", pname.substr(0, 32),
                                       "\" (an input takes binary_data_size)"));
      auto size = IntegerParameter(absl::StrCat(field, " binary_data_size"), value);
      if (!size.ok()) return size.status();
      binary_size = *size;
    }
  }
  const auto data = j.find("data");
  if (binary_size) {
    if (data != j.end())
      return Bad(field, "has both \"data\" and binary_data_size (send one or the other)");
    if (!binary->present)
      return Bad(field, absl::StrCat("binary_data_size needs the ", kInferenceHeaderLength,
                                     " header (the JSON's length, the binary data after it)"));
    const size_t left = binary->bytes.size() - binary->taken;
    if (*binary_size < 0 || static_cast<uint64_t>(*binary_size) > left)
      return Bad(field, absl::StrCat("binary_data_size is ", *binary_size, " but ", left,
                                     " bytes of binary data are left in the body"));
    t.data.assign(binary->bytes.data() + binary->taken, static_cast<size_t>(*binary_size));
    binary->taken += static_cast<size_t>(*binary_size);
    // Counts and well-formed BYTES elements: CheckContents names the tensor and what it needs.
    if (absl::Status st = CheckContents(t); !st.ok()) return st;
    return t;
  }
  if (data == j.end()) return Bad(field, "needs \"data\" (or binary_data_size)");
  Flattener f(&t, field);
  if (absl::Status st = f.Add(*data, 0); !st.ok()) return st;
  if (f.count() != *count)
    return Bad(field, absl::StrCat("data has ", f.count(), " elements but shape ",
                                   ShapeString(t.shape), " needs ", *count));
  return t;
}

// One output's data as a flat JSON array.
Json DataOf(const Tensor& t) {
  Json out = Json::array();
  const char* p = t.data.data();
  const size_t size = static_cast<size_t>(ElementBytes(t.datatype));
  auto each = [&](auto type_tag) {
    using T = decltype(type_tag);
    for (size_t at = 0; at + sizeof(T) <= t.data.size(); at += sizeof(T)) {
      T x;
      std::memcpy(&x, p + at, sizeof(T));
      out.push_back(x);
    }
  };
  switch (t.datatype) {
    case DataType::kBool:
      for (char c : t.data) out.push_back(c != 0);
      break;
    case DataType::kUint8:
      each(uint8_t{});
      break;
    case DataType::kUint16:
      each(uint16_t{});
      break;
    case DataType::kUint32:
      each(uint32_t{});
      break;
    case DataType::kUint64:
      each(uint64_t{});
      break;
    case DataType::kInt8:
      each(int8_t{});
      break;
    case DataType::kInt16:
      each(int16_t{});
      break;
    case DataType::kInt32:
      each(int32_t{});
      break;
    case DataType::kInt64:
      each(int64_t{});
      break;
    case DataType::kFp32:
      each(float{});
      break;
    case DataType::kFp64:
      each(double{});
      break;
    case DataType::kBytes:
      for (std::string_view e : BytesElements(t)) out.push_back(std::string(e));
      break;
    case DataType::kFp16:
    case DataType::kBf16:
      (void)size;
      break;  // never produced
  }
  return out;
}

}  // namespace

absl::StatusOr<InferRequest> ParseInferJson(absl::string_view body, const std::string& model,
                                            const std::string& version,
                                            std::optional<absl::string_view> header_length) {
  BinaryPart binary;
  if (header_length) {
    uint64_t n = 0;
    if (header_length->empty() || header_length->size() > 19 ||
        header_length->find_first_not_of("0123456789") != absl::string_view::npos)
      return Bad(kInferenceHeaderLength, "must be the JSON's length in bytes, a whole number");
    for (char c : *header_length) n = 10 * n + static_cast<uint64_t>(c - '0');
    if (n > body.size())
      return Bad(kInferenceHeaderLength,
                 absl::StrCat("is ", n, " but the body has only ", body.size(), " bytes"));
    binary.present = true;
    binary.bytes = body.substr(static_cast<size_t>(n));
    body = body.substr(0, static_cast<size_t>(n));
  }
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  for (const auto& [key, v] : j.items()) {
    if (key != "id" && key != "parameters" && key != "inputs" && key != "outputs")
      return Bad("request", absl::StrCat("unknown field \"", key.substr(0, 32),
                                         "\" (id, parameters, inputs, outputs)"));
  }
  InferRequest r;
  r.model = model;
  r.version = version;
  if (const auto id = j.find("id"); id != j.end()) {
    if (!id->is_string()) return Bad("id", "must be a string");
    r.id = id->get<std::string>();
  }
  if (const auto p = j.find("parameters"); p != j.end()) {
    auto params = ParametersOf(*p, "parameters");
    if (!params.ok()) return params.status();
    r.parameters = std::move(*params);
  }
  const auto inputs = j.find("inputs");
  if (inputs == j.end() || !inputs->is_array()) return Bad("inputs", "must be an array");
  for (size_t i = 0; i < inputs->size(); ++i) {
    auto t = InputOf((*inputs)[i], i, &binary);
    if (!t.ok()) return t.status();
    r.inputs.push_back(std::move(*t));
  }
  if (binary.taken != binary.bytes.size())
    return Bad("body", absl::StrCat(binary.bytes.size() - binary.taken,
                                    " bytes after the JSON belong to no input's binary_data_size"));
  if (const auto outputs = j.find("outputs"); outputs != j.end()) {
    if (!outputs->is_array()) return Bad("outputs", "must be an array");
    for (size_t i = 0; i < outputs->size(); ++i) {
      const Json& o = (*outputs)[i];
      const std::string field = absl::StrCat("outputs[", i, "]");
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string())
        return Bad(field, "must be an object with a string \"name\"");
      RequestedOutput out{o["name"].get<std::string>(), {}};
      if (const auto p = o.find("parameters"); p != o.end()) {
        auto params = ParametersOf(*p, absl::StrCat(field, ".parameters"));
        if (!params.ok()) return params.status();
        out.parameters = std::move(*params);
      }
      r.outputs.push_back(std::move(out));
    }
  }
  return r;
}

absl::StatusOr<BinaryOutputs> TakeBinaryOutputs(InferRequest* r) {
  BinaryOutputs b;
  if (auto it = r->parameters.find("binary_data_output"); it != r->parameters.end()) {
    if (!std::holds_alternative<bool>(it->second))
      return Bad("parameters.binary_data_output", "must be true or false");
    b.all = std::get<bool>(it->second);
    r->parameters.erase(it);
  }
  for (RequestedOutput& o : r->outputs) {
    auto it = o.parameters.find("binary_data");
    if (it == o.parameters.end()) continue;
    if (!std::holds_alternative<bool>(it->second))
      return Bad(absl::StrCat("output ", o.name.substr(0, 64), " binary_data"),
                 "must be true or false");
    b.per_output[o.name] = std::get<bool>(it->second);
    o.parameters.erase(it);
  }
  return b;
}

bool BinaryOutputs::Of(const std::string& output) const {
  const auto it = per_output.find(output);
  return it != per_output.end() ? it->second : all;
}

InferResponseBody ResponseBodyOf(const InferResponse& r, const BinaryOutputs& binary) {
  Json j;
  j["model_name"] = r.model;
  j["model_version"] = r.version;
  if (!r.id.empty()) j["id"] = r.id;
  j["outputs"] = Json::array();
  std::string tail;
  for (const Tensor& t : r.outputs) {
    Json o;
    o["name"] = t.name;
    o["datatype"] = DataTypeName(t.datatype);
    o["shape"] = t.shape;
    if (binary.Of(t.name)) {  // the raw form is the binary form: little-endian, BYTES prefixed
      o["parameters"] = {{"binary_data_size", t.data.size()}};
      tail += t.data;
    } else {
      o["data"] = DataOf(t);
    }
    j["outputs"].push_back(std::move(o));
  }
  InferResponseBody out;
  out.body = JsonText(j);
  if (!tail.empty() || std::any_of(r.outputs.begin(), r.outputs.end(),
                                   [&](const Tensor& t) { return binary.Of(t.name); })) {
    out.json_length = static_cast<int64_t>(out.body.size());
    out.body += tail;
  }
  return out;
}

std::string InferResponseJson(const InferResponse& r) { return ResponseBodyOf(r, {}).body; }

namespace {

// A repository request's body as a JSON object with only `allowed` at its top ({} when empty).
absl::StatusOr<Json> RepositoryBody(absl::string_view body, const char* allowed) {
  if (body.find_first_not_of(" \t\r\n") == absl::string_view::npos) return Json::object();
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  for (const auto& [key, v] : j.items()) {
    if (key != allowed)
      return Bad("request",
                 absl::StrCat("unknown field \"", key.substr(0, 32), "\" (", allowed, ")"));
  }
  return j;
}

}  // namespace

absl::StatusOr<bool> ParseRepositoryIndexJson(absl::string_view body) {
  auto j = RepositoryBody(body, "ready");
  if (!j.ok()) return j.status();
  const auto ready = j->find("ready");
  if (ready == j->end()) return false;
  if (!ready->is_boolean()) return Bad("ready", "must be true or false");
  return ready->get<bool>();
}

absl::StatusOr<Parameters> ParseRepositoryChangeJson(absl::string_view body) {
  auto j = RepositoryBody(body, "parameters");
  if (!j.ok()) return j.status();
  const auto p = j->find("parameters");
  if (p == j->end()) return Parameters();
  return ParametersOf(*p, "parameters");
}

std::string ModelMetadataJson(const ModelMetadata& m) {
  Json j;
  j["name"] = m.name;
  j["versions"] = m.versions;
  j["platform"] = m.platform;
  for (const auto& [key, specs] : {std::pair{"inputs", &m.inputs}, {"outputs", &m.outputs}}) {
    Json list = Json::array();
    for (const TensorSpec& s : *specs)
      list.push_back(
          {{"name", s.name}, {"datatype", DataTypeName(s.datatype)}, {"shape", s.shape}});
    j[key] = std::move(list);
  }
  return JsonText(j);
}

std::string ServerMetadataJson() {
  Json j;
  j["name"] = kServerName;
  j["version"] = ServerVersion();
  j["extensions"] = Extensions();
  return JsonText(j);
}

}  // namespace krause::server::oip
