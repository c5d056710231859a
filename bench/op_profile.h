// A per-operator time profile of LibTorch work on the calling thread, through ATen's
// RecordFunction callbacks (every dispatched op and every autograd backward function): self time
// (the op minus the ops it called) and calls per name, printed as a table. For finding where a
// training step spends its time when perf cannot name LibTorch's stripped symbols.
//
// Usage: OpProfile p; p.Start(); ...work...; p.Stop(); p.Print(25);
// Not thread-safe: one profile at a time; ops on other threads (intra-op workers) are counted
// inside the op that started them.
#pragma once

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace krause::bench {

class OpProfile {
 public:
  void Start() {
    State& s = Global();
    s.totals.clear();
    s.stack.clear();
    s.thread = std::this_thread::get_id();
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&OnStart, &OnEnd));
  }
  void Stop() { at::removeCallback(handle_); }

  // The `rows` names with the most self time, with their share of all recorded self time.
  void Print(int rows) const {
    const State& s = Global();
    std::vector<std::pair<std::string, Entry>> v(s.totals.begin(), s.totals.end());
    std::sort(v.begin(), v.end(),
              [](const auto& a, const auto& b) { return a.second.self > b.second.self; });
    double all = 0;
    for (const auto& [name, e] : v) all += e.self;
    std::printf("%-60s %10s %7s %9s\n", "op (self time)", "ms", "share", "calls");
    for (int i = 0; i < rows && i < static_cast<int>(v.size()); ++i) {
      std::printf("%-60.60s %10.1f %6.1f%% %9lld\n", v[i].first.c_str(), v[i].second.self * 1e3,
                  100 * v[i].second.self / all, static_cast<long long>(v[i].second.calls));
    }
    std::printf("%-60s %10.1f\n", "all recorded", all * 1e3);
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    double self = 0;
    int64_t calls = 0;
  };
  struct Frame {
    Clock::time_point start;
    double children = 0;
  };
  struct State {
    std::map<std::string, Entry> totals;
    std::vector<Frame> stack;
    std::thread::id thread;
  };
  static State& Global() {
    static State s;
    return s;
  }
  static std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction&) {
    State& s = Global();
    if (std::this_thread::get_id() == s.thread) s.stack.push_back({Clock::now(), 0});
    return nullptr;
  }
  static void OnEnd(const at::RecordFunction& fn, at::ObserverContext*) {
    State& s = Global();
    if (std::this_thread::get_id() != s.thread || s.stack.empty()) return;
    const Frame f = s.stack.back();
    s.stack.pop_back();
    const double total = std::chrono::duration<double>(Clock::now() - f.start).count();
    Entry& e = s.totals[fn.name()];
    e.self += total - f.children;
    ++e.calls;
    if (!s.stack.empty()) s.stack.back().children += total;
  }

  at::CallbackHandle handle_ = 0;
};

}  // namespace krause::bench
