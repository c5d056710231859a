#include "server/core/served_model.h"

#include <c10/core/Device.h>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"
#include "server/core/errors.h"

namespace krause::server {

const char* ModelKindName(ModelKind kind) {
  return kind == ModelKind::kClassifier ? "classifier" : "generator";
}

ServedModel::ServedModel(ModelSpec spec, const LoadedModel& model, ModelKind kind)
    : spec_(std::move(spec)), flops_(model.FlopsPerImage()) {
  info_.name = spec_.name;
  info_.version = spec_.version;
  info_.kind = kind;
  info_.device = spec_.device;
  info_.weights_dtype = WeightsDtypeName(spec_.weights_dtype);
  if (at::Device(spec_.device).is_cpu()) info_.cpu_kernels = cpu::CpuKernels().name;
  info_.checkpoint = model.path;
  const auto summary = model.metadata.find("summary");
  if (summary != model.metadata.end()) info_.summary = summary->second;
  info_.parameters = model.NumParameters();
  info_.flops_per_image_executed = flops_.executed_flops;
  info_.flops_per_image_dense_equivalent = flops_.dense_equivalent_flops;
  info_.is_default = spec_.is_default;
}

std::string GenerationNumerics(const ModelInfo& info) {
  const bool cpu = at::Device(info.device).is_cpu();
  return absl::StrCat(
      info.precision, " ", info.implementation, " on ", cpu ? "cpu" : "cuda",
      cpu ? absl::StrCat(", ", cpu::CpuKernelFamily(info.cpu_kernels.c_str()), " kernel family")
          : std::string(),
      ", ", info.weights_dtype, " weights, ", info.kv_cache_dtype, " cache");
}

namespace {

absl::Status NotThisKind(const ServedModel& m, const char* operation, const char* kind) {
  return absl::FailedPreconditionError(absl::StrCat(
      "model ", m.name(), " is a ", ModelKindName(m.kind()), "; ", operation, " needs a ", kind));
}

}  // namespace

absl::Status ServedModel::Classify(at::Tensor, const CallLimits&, ReplyPool*, ClassifyDone) {
  return NotThisKind(*this, "Classify", "classifier");
}

absl::Status ServedModel::Score(at::Tensor, std::vector<int64_t>, const CallLimits&, ReplyPool*,
                                ScoreDone) {
  return NotThisKind(*this, "Score", "generator");
}

absl::Status ServedModel::Generate(std::vector<GenerationRequest>,
                                   std::shared_ptr<GenerationReceiver>, const Share&) {
  return NotThisKind(*this, "Generate", "generator");
}

absl::Status ServedModel::Inspect(at::Tensor, int64_t, InspectOptions, const CallLimits&,
                                  ReplyPool*, InspectDone) {
  return NotThisKind(*this, "Inspect", "classifier or a generator");
}

absl::StatusOr<int64_t> ServedModel::ClassRow(bool, const std::string&, int64_t,
                                              const std::string& field) const {
  return InvalidField(field,
                      absl::StrCat(field, ": model ", name(), " is a ", ModelKindName(kind()),
                                   "; a class is for conditional generators"));
}

}  // namespace krause::server
