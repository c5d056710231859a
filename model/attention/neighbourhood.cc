#include "model/attention/neighbourhood.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace krause {

Neighbourhood Neighbourhood::Causal(int64_t window) {
  Neighbourhood nb;
  nb.kind = Kind::kCausal;
  nb.window = window;
  return nb;
}

Neighbourhood Neighbourhood::Grid(int64_t rows, int64_t cols, int64_t radius, GridMetric metric,
                                  bool cls) {
  Neighbourhood nb;
  nb.kind = Kind::kGrid;
  nb.rows = rows;
  nb.cols = cols;
  nb.radius = radius;
  nb.metric = metric;
  nb.cls = cls;
  return nb;
}

Neighbourhood Neighbourhood::Global() { return Neighbourhood(); }

std::string Neighbourhood::ToString() const {
  switch (kind) {
    case Kind::kCausal:
      return absl::StrCat("causal(W=", window, ")");
    case Kind::kGrid:
      return absl::StrCat("grid(", rows, "x", cols, ",r=", radius, ",",
                          metric == GridMetric::kManhattan ? "manhattan" : "chebyshev",
                          cls ? ",cls" : "", ")");
    case Kind::kGlobal:
      return "global";
  }
  return "unknown";
}

absl::Status ValidateNeighbourhood(const Neighbourhood& nb, int64_t n) {
  switch (nb.kind) {
    case Neighbourhood::Kind::kCausal:
      if (nb.window < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("neighbourhood.window must be >= 1, got ", nb.window));
      }
      return absl::OkStatus();
    case Neighbourhood::Kind::kGrid: {
      if (nb.rows < 1 || nb.cols < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "neighbourhood.rows and neighbourhood.cols must be >= 1, got ", nb.rows, "x", nb.cols));
      }
      if (nb.radius < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("neighbourhood.radius must be >= 0, got ", nb.radius));
      }
      const int64_t expected = nb.rows * nb.cols + (nb.cls ? 1 : 0);
      if (expected != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("neighbourhood grid ", nb.rows, "x", nb.cols, nb.cls ? " + CLS" : "",
                         " needs N = ", expected, " tokens, but q/k/v have N = ", n));
      }
      return absl::OkStatus();
    }
    case Neighbourhood::Kind::kGlobal:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("neighbourhood.kind is not a known kind");
}

namespace {

bool GridAdmits(const Neighbourhood& nb, int64_t dr, int64_t dc) {
  dr = std::llabs(dr);
  dc = std::llabs(dc);
  return nb.metric == GridMetric::kManhattan ? dr + dc <= nb.radius : std::max(dr, dc) <= nb.radius;
}

}  // namespace

void AppendCandidates(const Neighbourhood& nb, int64_t n, int64_t i, std::vector<int64_t>* out) {
  out->clear();
  switch (nb.kind) {
    case Neighbourhood::Kind::kCausal:
      for (int64_t j = std::max<int64_t>(0, i - nb.window + 1); j <= i; ++j) out->push_back(j);
      return;
    case Neighbourhood::Kind::kGlobal:
      for (int64_t j = 0; j < n; ++j) out->push_back(j);
      return;
    case Neighbourhood::Kind::kGrid: {
      const int64_t offset = nb.cls ? 1 : 0;
      if (nb.cls && i == 0) {  // the CLS row sees every token
        for (int64_t j = 0; j < n; ++j) out->push_back(j);
        return;
      }
      if (nb.cls) out->push_back(0);  // every patch sees CLS
      const int64_t p = i - offset;
      const int64_t r = p / nb.cols, c = p % nb.cols;
      // Raster order over the clipped square, so the list is ascending.
      for (int64_t rr = std::max<int64_t>(0, r - nb.radius);
           rr <= std::min<int64_t>(nb.rows - 1, r + nb.radius); ++rr) {
        for (int64_t cc = std::max<int64_t>(0, c - nb.radius);
             cc <= std::min<int64_t>(nb.cols - 1, c + nb.radius); ++cc) {
          if (GridAdmits(nb, rr - r, cc - c)) out->push_back(offset + rr * nb.cols + cc);
        }
      }
      return;
    }
  }
}

int64_t NumCandidates(const Neighbourhood& nb, int64_t n, int64_t i) {
  switch (nb.kind) {
    case Neighbourhood::Kind::kCausal:
      return std::min(i + 1, nb.window);
    case Neighbourhood::Kind::kGlobal:
      return n;
    case Neighbourhood::Kind::kGrid: {
      std::vector<int64_t> tmp;
      AppendCandidates(nb, n, i, &tmp);
      return static_cast<int64_t>(tmp.size());
    }
  }
  return 0;
}

int64_t MaxCandidates(const Neighbourhood& nb, int64_t n) {
  switch (nb.kind) {
    case Neighbourhood::Kind::kCausal:
      return std::min(n, nb.window);
    case Neighbourhood::Kind::kGlobal:
      return n;
    case Neighbourhood::Kind::kGrid:
      return CachedCandidateTable(nb, n)->width;  // enumerated once per (grid, n)
  }
  return 0;
}

CandidateTable BuildCandidateTable(const Neighbourhood& nb, int64_t n) {
  CandidateTable t;
  t.n = n;
  for (int64_t i = 0; i < n; ++i) t.width = std::max(t.width, NumCandidates(nb, n, i));
  t.index.assign(static_cast<size_t>(n * t.width), -1);
  t.count.assign(static_cast<size_t>(n), 0);
  std::vector<int64_t> row;
  for (int64_t i = 0; i < n; ++i) {
    AppendCandidates(nb, n, i, &row);
    t.count[i] = static_cast<int64_t>(row.size());
    std::copy(row.begin(), row.end(), t.index.begin() + i * t.width);
  }
  return t;
}

std::shared_ptr<const CandidateTable> CachedCandidateTable(const Neighbourhood& nb, int64_t n) {
  static std::mutex mu;
  static auto* tables = new std::map<std::string, std::shared_ptr<const CandidateTable>>();
  const std::string key = absl::StrCat(nb.ToString(), "/", n);
  std::lock_guard<std::mutex> lock(mu);
  auto it = tables->find(key);
  if (it != tables->end()) return it->second;
  if (tables->size() >= 256) tables->clear();  // a bound, not a policy: real models use a few
  auto table = std::make_shared<const CandidateTable>(BuildCandidateTable(nb, n));
  tables->emplace(key, table);
  return table;
}

}  // namespace krause
