// Which attention a model uses: Krause attention or its softmax baseline's. Model configs hold it
// parsed (ViTConfig, PixelModelConfig); checkpoints and the API keep the names "krause" and
// "softmax". Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace krause {

enum class AttentionKind { kKrause, kSoftmax };

const char* AttentionKindName(AttentionKind kind);  // "krause", "softmax"
// InvalidArgument "config.attention must be krause or softmax, got NAME" for any other name.
absl::StatusOr<AttentionKind> ParseAttentionKind(std::string_view name);

}  // namespace krause
