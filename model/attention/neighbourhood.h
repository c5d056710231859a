// Neighbourhoods N(i) of Krause attention (docs/operator.md, section 1.1) and their candidate
// enumeration, shared by every implementation (reference, windowed, fused CPU, decode, CUDA) so
// that all of them agree on exactly which keys a query may see.
//
// Thread-safety: value types and pure functions; safe to use from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace krause {

enum class GridMetric { kManhattan, kChebyshev };

struct Neighbourhood {
  enum class Kind { kCausal, kGrid, kGlobal };

  Kind kind = Kind::kGlobal;
  // causal(W): j in [max(0, i - W + 1), i], W keys including self.
  int64_t window = 0;
  // grid(rows, cols, radius, metric, cls): a rows x cols patch grid in raster order, optionally
  // preceded by a CLS token at index 0 that sees everything and is seen by every patch.
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t radius = 0;
  GridMetric metric = GridMetric::kManhattan;
  bool cls = false;

  static Neighbourhood Causal(int64_t window);
  static Neighbourhood Grid(int64_t rows, int64_t cols, int64_t radius, GridMetric metric,
                            bool cls);
  static Neighbourhood Global();

  // "causal(W=128)", "grid(8x8,r=1,manhattan,cls)", "global".
  std::string ToString() const;
};

// Checks the neighbourhood's own parameters and that it fits a sequence of n tokens.
// The error message names the offending argument and the limit.
absl::Status ValidateNeighbourhood(const Neighbourhood& nb, int64_t n);

// Appends to `out` (cleared first) the candidates of query i, in ascending key order.
// Precondition: ValidateNeighbourhood(nb, n).ok() and 0 <= i < n.
void AppendCandidates(const Neighbourhood& nb, int64_t n, int64_t i, std::vector<int64_t>* out);

// |N(i)| without enumerating it.
int64_t NumCandidates(const Neighbourhood& nb, int64_t n, int64_t i);

// max_i |N(i)| (grids: from CachedCandidateTable).
int64_t MaxCandidates(const Neighbourhood& nb, int64_t n);

// A dense table of candidates: row i holds N(i) in ascending order, padded with -1 to `width`
// = MaxCandidates(nb, n); `count[i]` = |N(i)|. Built once per call by the table-driven paths.
struct CandidateTable {
  int64_t n = 0;
  int64_t width = 0;
  std::vector<int64_t> index;  // [n * width], -1 padded
  std::vector<int64_t> count;  // [n]
};
CandidateTable BuildCandidateTable(const Neighbourhood& nb, int64_t n);
// The same, built once per (neighbourhood, n) and kept (a few hundred at most): a classifier's
// every forward reuses its layers' table instead of enumerating the grid again. Thread-safe.
std::shared_ptr<const CandidateTable> CachedCandidateTable(const Neighbourhood& nb, int64_t n);

}  // namespace krause
