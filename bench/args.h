// Command-line walking shared by the benchmarks: flags, their values, and a clear exit when a
// value is missing.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace krause::bench {

class ArgWalker {
 public:
  ArgWalker(int argc, char** argv) : argc_(argc), argv_(argv) {}
  // Moves to the next argument; false at the end.
  bool Next() { return ++i_ < argc_; }
  std::string flag() const { return argv_[i_]; }
  // The value after the current flag (consumed); exits with status 2 when there is none.
  const char* Value() {
    if (i_ + 1 >= argc_) {
      std::fprintf(stderr, "%s needs a value\n", argv_[i_]);
      std::exit(2);
    }
    return argv_[++i_];
  }
  // The flags the kernel and attention benchmarks share: --help or -h (prints `help`, exits 0),
  // --json FILE and --reps N (at least 1). True when the current flag is one of them (consumed).
  bool Common(void (*help)(), std::string* json_path, int* reps) {
    const std::string a = flag();
    if (a == "--help" || a == "-h") {
      help();
      std::exit(0);
    } else if (a == "--json") {
      *json_path = Value();
    } else if (a == "--reps") {
      *reps = std::max(1, std::atoi(Value()));
    } else {
      return false;
    }
    return true;
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
};

}  // namespace krause::bench
