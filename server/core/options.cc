#include "server/core/options.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "model/engine/kernel_check.h"
#include "model/util/files.h"

namespace krause::server {
namespace {

namespace fs = std::filesystem;

bool ValidName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

absl::Status CheckRange(const std::string& field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be in [", lo, ", ", hi, "], got ", v));
  return absl::OkStatus();
}

// Reads m[key] into *out when present; a value of the wrong JSON type is InvalidArgument naming
// the key, the type it needs and what it got (no conversion: 2.5 is not an integer, "1" is not a
// number).
template <typename T>
absl::Status ReadTyped(const nlohmann::json& m, const char* key, const std::string& where,
                       bool (nlohmann::json::*has_type)() const noexcept, const char* want,
                       T* out) {
  const auto it = m.find(key);
  if (it == m.end()) return absl::OkStatus();
  if (!((*it).*has_type)())
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", key, " must be ", want, ", got ", it->type_name()));
  *out = it->get<T>();
  return absl::OkStatus();
}
absl::Status ReadKey(const nlohmann::json& m, const char* key, const std::string& where,
                     std::string* out) {
  return ReadTyped(m, key, where, &nlohmann::json::is_string, "a string", out);
}
absl::Status ReadKey(const nlohmann::json& m, const char* key, const std::string& where,
                     bool* out) {
  return ReadTyped(m, key, where, &nlohmann::json::is_boolean, "true or false", out);
}
absl::Status ReadKey(const nlohmann::json& m, const char* key, const std::string& where,
                     int64_t* out) {
  const auto it = m.find(key);
  if (it == m.end()) return absl::OkStatus();
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " is too large: ", u));
    *out = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  if (!it->is_number_integer())
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be an integer, got ",
                                                   it->type_name(), " ", it->dump()));
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

constexpr KvCacheDtype kKvCacheDtypes[] = {KvCacheDtype::kFloat32, KvCacheDtype::kBFloat16,
                                           KvCacheDtype::kFloat16};
constexpr WeightsDtype kWeightsDtypes[] = {WeightsDtype::kFloat32, WeightsDtype::kBFloat16};

// The value of `all` whose name (`name_of`) is `name`, or nullptr.
template <typename E, size_t N>
const E* ByName(const E (&all)[N], const char* (*name_of)(E), const std::string& name) {
  const E* it =
      std::find_if(std::begin(all), std::end(all), [&](E e) { return name == name_of(e); });
  return it == std::end(all) ? nullptr : it;
}

}  // namespace

const char* KvCacheDtypeName(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kFloat32:
      return "float32";
    case KvCacheDtype::kBFloat16:
      return "bfloat16";
    case KvCacheDtype::kFloat16:
      return "float16";
  }
  return "?";
}

const char* WeightsDtypeName(WeightsDtype dtype) {
  return dtype == WeightsDtype::kBFloat16 ? "bfloat16" : "float32";
}

absl::Status ReadSamplingDefaults(const nlohmann::json& m, const std::string& where,
                                  SamplingDefaults* out) {
  for (auto [key, field] : {std::pair{"temperature", &out->temperature},
                            {"top_p", &out->top_p},
                            {"guidance", &out->guidance}}) {
    const auto it = m.find(key);
    if (it == m.end()) continue;
    if (!it->is_number())
      return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be a number, got ",
                                                     it->type_name(), " ", it->dump()));
    *field = it->get<double>();
  }
  if (const auto it = m.find("top_k"); it != m.end()) {
    int64_t k = 0;
    if (absl::Status st = ReadKey(m, "top_k", where, &k); !st.ok()) return st;
    out->top_k = k;
  }
  return absl::OkStatus();
}

const char* KernelCheckModeName(KernelCheckMode mode) {
  switch (mode) {
    case KernelCheckMode::kStrict:
      return "strict";
    case KernelCheckMode::kOff:
      return "off";
    case KernelCheckMode::kFallback:
      break;
  }
  return "fallback";
}

absl::StatusOr<KernelCheckMode> ParseKernelCheckMode(const std::string& name) {
  for (KernelCheckMode m :
       {KernelCheckMode::kFallback, KernelCheckMode::kStrict, KernelCheckMode::kOff}) {
    if (name == KernelCheckModeName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--kernel_check must be fallback, strict or off, got \"", name, "\""));
}

absl::Status ReadServingOptions(const nlohmann::json& m, const std::string& where,
                                const std::set<std::string>& extra_keys, ModelSpec* spec) {
  static const std::set<std::string> kKeys = {"attention_impl",
                                              "cuda_graphs",
                                              "device",
                                              "default",
                                              "max_batch_size",
                                              "max_queue_delay_ms",
                                              "max_queued_images",
                                              "max_sequences",
                                              "max_waiting",
                                              "max_images_per_request",
                                              "kv_cache_dtype",
                                              "weights_dtype",
                                              "precision",
                                              "temperature",
                                              "top_p",
                                              "top_k",
                                              "guidance"};
  if (!m.is_object()) return absl::InvalidArgumentError(where + " is not an object");
  for (const auto& [key, value] : m.items()) {
    if (!kKeys.count(key) && !extra_keys.count(key)) {
      std::set<std::string> known = kKeys;
      known.insert(extra_keys.begin(), extra_keys.end());
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": unknown key \"", key, "\" (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  ModelSpec& s = *spec;
  std::string cache_dtype = KvCacheDtypeName(s.kv_cache_dtype);
  std::string weights_dtype = WeightsDtypeName(s.weights_dtype);
  std::string precision = PrecisionName(s.precision);
  for (absl::Status st :
       {ReadKey(m, "device", where, &s.device), ReadKey(m, "default", where, &s.is_default),
        ReadKey(m, "max_batch_size", where, &s.max_batch_size),
        ReadKey(m, "max_queue_delay_ms", where, &s.max_queue_delay_ms),
        ReadKey(m, "max_queued_images", where, &s.max_queued_images),
        ReadKey(m, "max_sequences", where, &s.max_sequences),
        ReadKey(m, "max_waiting", where, &s.max_waiting),
        ReadKey(m, "cuda_graphs", where, &s.cuda_graphs),
        ReadKey(m, "kv_cache_dtype", where, &cache_dtype),
        ReadKey(m, "weights_dtype", where, &weights_dtype),
        ReadKey(m, "precision", where, &precision),
        ReadKey(m, "max_images_per_request", where, &s.max_images_per_request),
        ReadKey(m, "attention_impl", where, &s.attention_impl),
        ReadSamplingDefaults(m, where, &s.sampling)}) {
    if (!st.ok()) return st;
  }
  const std::string w = where + ".";
  absl::Status st = CheckRange(w + "max_batch_size", s.max_batch_size, 1, 4096);
  if (st.ok()) st = CheckRange(w + "max_queue_delay_ms", s.max_queue_delay_ms, 0, 10000);
  if (st.ok()) st = CheckRange(w + "max_queued_images", s.max_queued_images, 1, 1 << 20);
  if (st.ok()) st = CheckRange(w + "max_sequences", s.max_sequences, 1, 4096);
  if (st.ok()) st = CheckRange(w + "max_waiting", s.max_waiting, 0, 1 << 20);
  if (st.ok()) st = CheckRange(w + "max_images_per_request", s.max_images_per_request, 0, 4096);
  if (!st.ok()) return st;
  const KvCacheDtype* dtype = ByName(kKvCacheDtypes, &KvCacheDtypeName, cache_dtype);
  if (dtype == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        w, "kv_cache_dtype must be float32, bfloat16 or float16, got \"", cache_dtype, "\""));
  }
  s.kv_cache_dtype = *dtype;
  const WeightsDtype* weights = ByName(kWeightsDtypes, &WeightsDtypeName, weights_dtype);
  if (weights == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(w, "weights_dtype must be float32 or bfloat16, got \"", weights_dtype, "\""));
  }
  s.weights_dtype = *weights;
  const auto parsed_precision = ParsePrecision(precision, w + "precision");
  if (!parsed_precision.ok()) return parsed_precision.status();
  s.precision = *parsed_precision;
  if (s.precision == Precision::kBf16) {
    // bf16 GEMMs take the weights rounded to bfloat16, as every implementation then sees them
    // (the kernel check's reference included; an fp32 fallback serves exactly those weights).
    if (m.contains("weights_dtype") && s.weights_dtype != WeightsDtype::kBFloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          w,
          "precision bf16 rounds the weights to bfloat16: weights_dtype must be bfloat16 or "
          "absent, got \"",
          weights_dtype, "\""));
    }
    s.weights_dtype = WeightsDtype::kBFloat16;
  }
  if (std::find(std::begin(kServingImplNames), std::end(kServingImplNames), s.attention_impl) ==
      std::end(kServingImplNames)) {
    return absl::InvalidArgumentError(absl::StrCat(w, "attention_impl must be ",
                                                   absl::StrJoin(kServingImplNames, ", "),
                                                   ", got \"", s.attention_impl, "\""));
  }
  return absl::OkStatus();
}

bool ValidModelName(const std::string& name) { return ValidName(name); }

absl::StatusOr<std::vector<ModelSpec>> ParseManifest(const std::string& json,
                                                     const std::string& base_dir) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("models") || !j["models"].is_array())
    return absl::InvalidArgumentError("manifest: expected a JSON object {\"models\": [...]}");
  std::vector<ModelSpec> specs;
  std::set<std::string> names;
  for (size_t i = 0; i < j["models"].size(); ++i) {
    const nlohmann::json& m = j["models"][i];
    const std::string where = absl::StrCat("manifest: models[", i, "]");
    ModelSpec s;
    if (absl::Status st = ReadServingOptions(m, where, {"name", "checkpoint"}, &s); !st.ok())
      return st;
    for (absl::Status st :
         {ReadKey(m, "name", where, &s.name), ReadKey(m, "checkpoint", where, &s.checkpoint)}) {
      if (!st.ok()) return st;
    }
    if (!ValidName(s.name))
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".name must match [A-Za-z0-9._-]{1,64}, got \"", s.name, "\""));
    if (!names.insert(s.name).second)
      return absl::InvalidArgumentError(absl::StrCat(where, ".name \"", s.name, "\" is repeated"));
    if (s.checkpoint.empty())
      return absl::InvalidArgumentError(absl::StrCat(where, ".checkpoint is required"));
    if (fs::path(s.checkpoint).is_relative() && !base_dir.empty())
      s.checkpoint = (fs::path(base_dir) / s.checkpoint).lexically_normal().string();
    specs.push_back(std::move(s));
  }
  if (specs.empty()) return absl::InvalidArgumentError("manifest: models is empty");
  return specs;
}

absl::StatusOr<std::vector<ModelSpec>> ReadManifest(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  auto specs = ParseManifest(*text, fs::path(path).parent_path().string());
  if (!specs.ok())
    return absl::Status(specs.status().code(), absl::StrCat(path, ": ", specs.status().message()));
  return specs;
}

absl::StatusOr<std::vector<ModelSpec>> BundledManifest(const std::string& dir,
                                                       const std::string& device,
                                                       bool cuda_graphs) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  if (files.empty())
    return absl::NotFoundError(absl::StrCat(dir, ": no *.safetensors models to serve"));
  std::sort(files.begin(), files.end());
  std::vector<ModelSpec> specs;
  for (const std::string& f : files) {
    ModelSpec s;
    s.name = fs::path(f).stem().string();
    std::replace(s.name.begin(), s.name.end(), '_', '-');
    s.checkpoint = f;
    s.device = device;
    s.cuda_graphs = cuda_graphs;
    s.is_default = absl::StartsWith(s.name, "krause") || absl::StartsWith(s.name, "karm");
    specs.push_back(std::move(s));
  }
  return specs;
}

absl::StatusOr<std::vector<std::string>> ReadTokens(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  std::vector<std::string> tokens;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    const std::string t(absl::StripAsciiWhitespace(line));
    if (t.empty() || t[0] == '#') continue;
    tokens.push_back(t);
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tokens"));
  return tokens;
}

}  // namespace krause::server
