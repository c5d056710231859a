#include "model/attention_kind.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace krause {

const char* AttentionKindName(AttentionKind kind) {
  return kind == AttentionKind::kKrause ? "krause" : "softmax";
}

absl::StatusOr<AttentionKind> ParseAttentionKind(std::string_view name) {
  if (name == "krause") return AttentionKind::kKrause;
  if (name == "softmax") return AttentionKind::kSoftmax;
  return absl::InvalidArgumentError(
      absl::StrCat("config.attention must be krause or softmax, got ", std::string(name)));
}

}  // namespace krause
