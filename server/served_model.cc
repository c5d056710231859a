#include "server/served_model.h"

namespace krause::server {

ServedModel::ServedModel(ModelSpec spec, const LoadedModel& model, ModelKind kind)
    : spec_(std::move(spec)), flops_(model.FlopsPerImage()) {
  info_.name = spec_.name;
  info_.version = spec_.version;
  info_.kind = kind;
  info_.device = spec_.device;
  info_.checkpoint = model.path;
  const auto summary = model.metadata.find("summary");
  if (summary != model.metadata.end()) info_.summary = summary->second;
  info_.parameters = model.NumParameters();
  info_.flops_per_image_executed = flops_.executed_flops;
  info_.flops_per_image_dense_equivalent = flops_.dense_equivalent_flops;
  info_.is_default = spec_.is_default;
}

}  // namespace krause::server
