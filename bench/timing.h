// Timing shared by the benchmarks: a run's seconds, the timed runs after a warm-up, and the JSON
// records file.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace krause::bench {

// Seconds of one call of fn.
inline double SecondsOf(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The times after a warm-up call of fn that took `first` seconds, sorted: `first` alone when it
// took over 2 s (or reps is 0), else `reps` timed calls.
inline std::vector<double> RunsAfterWarmUp(const std::function<void()>& fn, int reps,
                                           double first) {
  std::vector<double> times;
  if (first > 2.0 || reps == 0) {
    times.push_back(first);
  } else {
    for (int i = 0; i < reps; ++i) times.push_back(SecondsOf(fn));
  }
  std::sort(times.begin(), times.end());
  return times;
}

// `path` as a JSON array of `records` (each one JSON object), one a line; says so on stdout.
inline void WriteJsonRecords(const std::string& path, const std::vector<std::string>& records) {
  std::ofstream js(path);
  js << "[\n";
  for (size_t i = 0; i < records.size(); ++i)
    js << "  " << records[i] << (i + 1 < records.size() ? ",\n" : "\n");
  js << "]\n";
  std::printf("\nwrote %zu records to %s\n", records.size(), path.c_str());
}

}  // namespace krause::bench
