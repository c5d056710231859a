// ModelInfo (model_info.h) to the public krause.v1.ModelInfo and ModelKind to its enum: the proto
// edge of the registry's descriptions (ListModels, GetModel). Thread-safety: pure functions.
#pragma once

#include "krause/v1/krause.pb.h"
#include "server/core/model_info.h"

namespace krause::server {

v1::ModelInfo ToProto(const ModelInfo& info);
v1::ModelInfo::Kind ToProto(ModelKind kind);

}  // namespace krause::server
