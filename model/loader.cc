#include "model/loader.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/checkpoint/safetensors.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {
namespace {

absl::Status WithPath(const std::string& path, const absl::Status& s) {
  if (absl::StartsWith(s.message(), path)) return s;  // the reader named the file already
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

template <typename Model>
absl::Status Save(const std::string& path, const Model& model,
                  std::map<std::string, std::string> metadata) {
  metadata["config"] = model.config().ToJson();
  NamedTensors tensors;
  for (const auto& [name, t] : model.parameters().items())
    tensors.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  return WriteSafetensors(path, tensors, metadata);
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, const std::string& device,
                                      at::ScalarType linear_dtype) {
  if (!std::filesystem::exists(path))
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  at::Device dev(at::kCPU);
  bool parsed = true;
  try {
    dev = at::Device(device);
  } catch (const std::exception&) {
    parsed = false;  // not a device name LibTorch knows
  }
  if (!parsed || (!dev.is_cpu() && !dev.is_cuda()))
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu, cuda or cuda:N, got \"", device, "\""));
  if (dev.is_cuda() && !at::hasCUDA())
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": device ", device, " requested but no CUDA device is available"));
  auto contents = ReadSafetensors(path);
  if (!contents.ok()) return WithPath(path, contents.status());
  LoadedModel out;
  out.path = path;
  out.metadata = contents->metadata;
  const auto it = out.metadata.find("config");
  if (it == out.metadata.end())
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no \"config\" in the safetensors metadata"));
  const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": metadata \"config\" is not a JSON object"));
  const std::string kind = j.value("model", "");
  try {
    if (kind == "vit") {
      auto cfg = ViTConfig::FromJson(it->second);
      if (!cfg.ok()) return WithPath(path, cfg.status());
      auto m = ViT::Create(*cfg, 0);
      if (!m.ok()) return WithPath(path, m.status());
      absl::Status st =
          m->parameters().LoadStrict(contents->tensors, ViT::IgnoredCheckpointNames());
      if (st.ok()) st = m->parameters().RoundLinear(linear_dtype);
      if (!st.ok()) return WithPath(path, st);
      m->parameters().To(dev);
      out.vit = std::make_shared<const ViT>(std::move(*m));
    } else if (kind == "arm") {
      auto cfg = PixelModelConfig::FromJson(it->second);
      if (!cfg.ok()) return WithPath(path, cfg.status());
      auto m = PixelModel::Create(*cfg, 0);
      if (!m.ok()) return WithPath(path, m.status());
      absl::Status st = m->parameters().LoadStrict(contents->tensors);
      if (st.ok()) st = m->parameters().RoundLinear(linear_dtype);
      if (!st.ok()) return WithPath(path, st);
      m->parameters().To(dev);
      out.pixel = std::make_shared<const PixelModel>(std::move(*m));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": config.model must be \"vit\" or \"arm\", got \"", kind, "\""));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(path, ": ", ExceptionMessage(e)));
  }
  return out;
}

absl::StatusOr<at::ScalarType> ParseLinearDtype(const std::string& name, const std::string& what) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be float32 or bfloat16, got \"", name, "\""));
}

absl::Status SaveModel(const std::string& path, const ViT& model,
                       std::map<std::string, std::string> metadata) {
  return Save(path, model, std::move(metadata));
}

absl::Status SaveModel(const std::string& path, const PixelModel& model,
                       std::map<std::string, std::string> metadata) {
  return Save(path, model, std::move(metadata));
}

}  // namespace krause
