// A CPU allocator that wraps LibTorch's and counts bytes in use and their peak, so benchmarks can
// report the peak extra memory of one call. Install once with CountingAllocator::Install().
// Thread-safe (atomics).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace krause::bench {

class CountingAllocator final : public c10::Allocator {
 public:
  static CountingAllocator& Install() {
    static CountingAllocator* const instance = [] {
      auto* a = new CountingAllocator(c10::GetCPUAllocator());
      c10::SetCPUAllocator(a, /*priority=*/100);
      return a;
    }();
    return *instance;
  }

  // LibTorch 1.13 declares allocate() const, 2.x non-const: define both (no `override`), so the
  // class builds against either and the virtual call lands here.
  c10::DataPtr allocate(size_t n) const { return Allocate(n); }
  c10::DataPtr allocate(size_t n) { return Allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // Pure virtual in newer LibTorch (2.x); a plain extra method on 1.13.
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  // Starts a measurement: the peak restarts at the bytes in use now.
  void ResetPeak() { peak_.store(in_use_.load()); }
  int64_t in_use() const { return in_use_.load(); }
  int64_t peak() const { return peak_.load(); }

 private:
  c10::DataPtr Allocate(size_t n) const {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* ctx = new Context{std::move(inner), n, this};
    const int64_t now = in_use_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, ctx, &Release, device};
  }
  struct Context {
    c10::DataPtr inner;
    size_t bytes;
    const CountingAllocator* owner;
  };
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  static void Release(void* p) {
    auto* ctx = static_cast<Context*>(p);
    ctx->owner->in_use_.fetch_sub(static_cast<int64_t>(ctx->bytes));
    delete ctx;
  }

  c10::Allocator* base_;
  mutable std::atomic<int64_t> in_use_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace krause::bench
