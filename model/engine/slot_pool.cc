#include "model/engine/slot_pool.h"

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"

namespace krause {

SlotPool::SlotPool(int64_t capacity) : used_(static_cast<size_t>(capacity), false) {}

absl::StatusOr<int64_t> SlotPool::Reserve() const {
  for (size_t i = 0; i < used_.size(); ++i) {
    if (!used_[i]) return static_cast<int64_t>(i);
  }
  return absl::UnavailableError(absl::StrCat("all ", used_.size(), " cache slots are in use"));
}

void SlotPool::Commit(int64_t slot) {
  TORCH_CHECK(!used_[slot], "slot ", slot, " committed twice");
  used_[slot] = true;
  ++in_use_;
}

void SlotPool::Release(int64_t slot) {
  TORCH_CHECK(used_[slot], "slot ", slot, " released twice");
  used_[slot] = false;
  --in_use_;
}

}  // namespace krause
