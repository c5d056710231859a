// A one-line progress display with elapsed time and ETA on stderr, for the benchmarks.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace krause::bench {

struct Progress {
  int total = 0, done = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  // Marks one more measurement done and redraws the line.
  void Step(const std::string& what) {
    ++done;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = elapsed / done * (total - done);
    std::fprintf(stderr, "\r[%3d/%3d] %-60s elapsed %5.0fs  eta ~%5.0fs", done, total,
                 what.substr(0, 60).c_str(), elapsed, eta);
    if (done == total) std::fprintf(stderr, "\n");
  }
};

}  // namespace krause::bench
