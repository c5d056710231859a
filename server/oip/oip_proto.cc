#include "server/oip/oip_proto.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace krause::server::oip {
namespace {

absl::StatusOr<Parameters> ParametersOf(
    const google::protobuf::Map<std::string, inference::InferParameter>& in,
    absl::string_view where) {
  Parameters out;
  for (const auto& [name, p] : in) {
    switch (p.parameter_choice_case()) {
      case inference::InferParameter::kBoolParam:
        out[name] = p.bool_param();
        break;
      case inference::InferParameter::kInt64Param:
        out[name] = p.int64_param();
        break;
      case inference::InferParameter::kUint64Param:
        out[name] = p.uint64_param();
        break;
      case inference::InferParameter::kDoubleParam:
        out[name] = p.double_param();
        break;
      case inference::InferParameter::kStringParam:
        out[name] = p.string_param();
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(where, "parameter ", name.substr(0, 64), " has no value"));
    }
  }
  return out;
}

// Appends `values` converted to `To`, each checked to fit (the typed field of an 8- or 16-bit
// type is 32 bits wide).
template <typename To, typename From>
absl::Status AppendAs(const google::protobuf::RepeatedField<From>& values, const Tensor& t,
                      std::string* data) {
  data->reserve(values.size() * sizeof(To));
  for (const From v : values) {
    if constexpr (!std::is_same_v<To, From> && !std::is_floating_point_v<To>) {
      if (v < static_cast<From>(std::numeric_limits<To>::min()) ||
          v > static_cast<From>(std::numeric_limits<To>::max()))
        return absl::InvalidArgumentError(absl::StrCat("input ", t.name, ": value ", v,
                                                       " does not fit ", DataTypeName(t.datatype)));
    }
    const To x = static_cast<To>(v);
    data->append(reinterpret_cast<const char*>(&x), sizeof(To));
  }
  return absl::OkStatus();
}

// The typed contents of `t` (its datatype's field only) as raw bytes.
absl::Status TypedContents(const inference::InferTensorContents& c, Tensor* t) {
  // How many typed fields hold values, and whether the datatype's is among them.
  const int filled = (c.bool_contents_size() > 0) + (c.int_contents_size() > 0) +
                     (c.int64_contents_size() > 0) + (c.uint_contents_size() > 0) +
                     (c.uint64_contents_size() > 0) + (c.fp32_contents_size() > 0) +
                     (c.fp64_contents_size() > 0) + (c.bytes_contents_size() > 0);
  absl::Status st;
  bool own = false;  // the datatype's field has the values (or nothing has any)
  switch (t->datatype) {
    case DataType::kBool:
      own = c.bool_contents_size() > 0;
      for (bool b : c.bool_contents()) t->data.push_back(b ? 1 : 0);
      break;
    case DataType::kInt8:
      own = c.int_contents_size() > 0;
      st = AppendAs<int8_t>(c.int_contents(), *t, &t->data);
      break;
    case DataType::kInt16:
      own = c.int_contents_size() > 0;
      st = AppendAs<int16_t>(c.int_contents(), *t, &t->data);
      break;
    case DataType::kInt32:
      own = c.int_contents_size() > 0;
      st = AppendAs<int32_t>(c.int_contents(), *t, &t->data);
      break;
    case DataType::kInt64:
      own = c.int64_contents_size() > 0;
      st = AppendAs<int64_t>(c.int64_contents(), *t, &t->data);
      break;
    case DataType::kUint8:
      own = c.uint_contents_size() > 0;
      st = AppendAs<uint8_t>(c.uint_contents(), *t, &t->data);
      break;
    case DataType::kUint16:
      own = c.uint_contents_size() > 0;
      st = AppendAs<uint16_t>(c.uint_contents(), *t, &t->data);
      break;
    case DataType::kUint32:
      own = c.uint_contents_size() > 0;
      st = AppendAs<uint32_t>(c.uint_contents(), *t, &t->data);
      break;
    case DataType::kUint64:
      own = c.uint64_contents_size() > 0;
      st = AppendAs<uint64_t>(c.uint64_contents(), *t, &t->data);
      break;
    case DataType::kFp32:
      own = c.fp32_contents_size() > 0;
      st = AppendAs<float>(c.fp32_contents(), *t, &t->data);
      break;
    case DataType::kFp64:
      own = c.fp64_contents_size() > 0;
      st = AppendAs<double>(c.fp64_contents(), *t, &t->data);
      break;
    case DataType::kBytes:
      own = c.bytes_contents_size() > 0;
      for (const std::string& e : c.bytes_contents()) AppendBytesElement(e, &t->data);
      break;
    case DataType::kFp16:
    case DataType::kBf16:
      if (filled == 0) break;
      return absl::InvalidArgumentError(absl::StrCat("input ", t->name, ": ",
                                                     DataTypeName(t->datatype),
                                                     " has no typed contents; send it raw"));
  }
  if (!st.ok()) return st;
  if (filled > (own ? 1 : 0))
    return absl::InvalidArgumentError(absl::StrCat("input ", t->name,
                                                   ": typed contents in a field other than ",
                                                   DataTypeName(t->datatype), "'s"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InferRequest> FromProto(const inference::ModelInferRequest& r) {
  InferRequest out;
  out.model = r.model_name();
  out.version = r.model_version();
  out.id = r.id();
  auto params = ParametersOf(r.parameters(), "");
  if (!params.ok()) return params.status();
  out.parameters = std::move(*params);
  const bool raw = r.raw_input_contents_size() > 0;
  if (raw && r.raw_input_contents_size() != r.inputs_size())
    return absl::InvalidArgumentError(absl::StrCat("raw_input_contents has ",
                                                   r.raw_input_contents_size(), " entries for ",
                                                   r.inputs_size(), " inputs (one per input)"));
  for (int i = 0; i < r.inputs_size(); ++i) {
    const auto& in = r.inputs(i);
    Tensor t;
    t.name = in.name();
    const std::string field = absl::StrCat("input ", t.name);
    auto type = ParseDataType(in.datatype(), field);
    if (!type.ok()) return type.status();
    t.datatype = *type;
    t.shape.assign(in.shape().begin(), in.shape().end());
    auto count = ElementCount(t.shape, field);
    if (!count.ok()) return count.status();
    if (raw) {
      if (in.has_contents())
        return absl::InvalidArgumentError(absl::StrCat(
            field,
            ": has typed contents in a request with raw_input_contents (use one or the other)"));
      t.data = r.raw_input_contents(i);
    } else {
      if (absl::Status st = TypedContents(in.contents(), &t); !st.ok()) return st;
    }
    if (absl::Status st = CheckContents(t); !st.ok()) return st;
    out.inputs.push_back(std::move(t));
  }
  for (const auto& o : r.outputs()) {
    auto op = ParametersOf(o.parameters(), absl::StrCat("output ", o.name().substr(0, 64), ": "));
    if (!op.ok()) return op.status();
    out.outputs.push_back({o.name(), std::move(*op)});
  }
  return out;
}

void ToProto(const InferResponse& r, inference::ModelInferResponse* out) {
  out->set_model_name(r.model);
  out->set_model_version(r.version);
  out->set_id(r.id);
  for (const Tensor& t : r.outputs) {
    auto* o = out->add_outputs();
    o->set_name(t.name);
    o->set_datatype(DataTypeName(t.datatype));
    for (int64_t d : t.shape) o->add_shape(d);
    out->add_raw_output_contents(t.data);
  }
}

void ToProto(const ModelMetadata& m, inference::ModelMetadataResponse* out) {
  out->set_name(m.name);
  for (const std::string& v : m.versions) out->add_versions(v);
  out->set_platform(m.platform);
  for (const auto& [specs, field] :
       {std::pair{&m.inputs, out->mutable_inputs()}, {&m.outputs, out->mutable_outputs()}}) {
    for (const TensorSpec& s : *specs) {
      auto* t = field->Add();
      t->set_name(s.name);
      t->set_datatype(DataTypeName(s.datatype));
      for (int64_t d : s.shape) t->add_shape(d);
    }
  }
}

}  // namespace krause::server::oip
