// Which of a KV cache's slots are in use (the decode engine's bookkeeping). Reserve() has no side
// effects and tells whether (and which) slot is free, Commit() takes it, Release() frees it; a
// full pool is a status the scheduler handles (the request waits), not an error.
//
// Thread-safety: none; one engine thread owns a pool.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace krause {

class SlotPool {
 public:
  explicit SlotPool(int64_t capacity);
  // The lowest free slot, without taking it; Unavailable when every slot is in use.
  absl::StatusOr<int64_t> Reserve() const;
  void Commit(int64_t slot);   // precondition: slot is free
  void Release(int64_t slot);  // precondition: slot is in use
  bool InUse(int64_t slot) const { return used_[slot]; }
  int64_t capacity() const { return static_cast<int64_t>(used_.size()); }
  int64_t in_use() const { return in_use_; }

 private:
  std::vector<bool> used_;
  int64_t in_use_ = 0;
};

}  // namespace krause
