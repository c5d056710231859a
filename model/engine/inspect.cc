#include "model/engine/inspect.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "model/attention/attention_trace.h"
#include "model/attention/neighbourhood.h"
#include "model/util/tensor_checks.h"

namespace krause {
namespace {

// `asked`, or every index 0 .. count-1 when it is empty.
std::vector<int64_t> AllIfEmpty(const std::vector<int64_t>& asked, int64_t count) {
  if (!asked.empty()) return asked;
  std::vector<int64_t> all(count);
  std::iota(all.begin(), all.end(), 0);
  return all;
}

// The layers to record, ascending (as the forward meets them).
std::vector<int64_t> LayersAsked(const InspectShape& shape, const InspectOptions& o) {
  std::vector<int64_t> layers = AllIfEmpty(o.layers, shape.layers);
  std::sort(layers.begin(), layers.end());
  return layers;
}

// Keys listed per query in layer l.
int64_t ListedK(const InspectShape& shape, const InspectOptions& o, int64_t l) {
  if (!shape.krause && o.top_k > 0) return std::min(o.top_k, shape.tokens);
  return std::min(shape.layer_k[l], shape.tokens);
}

// One query's weights over its keys, as (key, weight) pairs; every key with a weight (Krause:
// the kept ones; softmax: the row, zeros left out).
using Row = std::vector<std::pair<int64_t, float>>;

// The listing order: weight descending, the larger key first on a tie (the operator's tie rule).
bool Ranks(const std::pair<int64_t, float>& a, const std::pair<int64_t, float>& b) {
  return a.second != b.second ? a.second > b.second : a.first > b.first;
}

double Distance(const std::pair<int64_t, int64_t>& a, const std::pair<int64_t, int64_t>& b) {
  const double dr = static_cast<double>(a.first - b.first);
  const double dc = static_cast<double>(a.second - b.second);
  return std::sqrt(dr * dr + dc * dc);
}

// Summaries and listings of one recorded layer.
LayerAttention Summarise(const AttentionTrace::Layer& rec, const InspectShape& shape,
                         const InspectOptions& o, const std::vector<int64_t>& queries,
                         const std::vector<std::pair<int64_t, int64_t>>& positions) {
  LayerAttention out;
  out.layer = rec.layer;
  const int64_t n = shape.tokens;
  const bool krause = rec.indices.defined();
  at::Tensor indices, weights, probs, sigma;
  if (krause) {
    indices = rec.indices.to(at::kCPU).contiguous();
    weights = rec.weights.to(at::kCPU, at::kFloat).contiguous();
    sigma = rec.sigma.to(at::kCPU, at::kDouble).contiguous();
    out.k = indices.size(3);  // what the layer keeps
  } else {
    probs = rec.probs.to(at::kCPU, at::kFloat).contiguous();
    out.k = ListedK(shape, o, rec.layer);
  }
  const int64_t kk = out.k;
  std::vector<bool> asked(n, false);
  for (int64_t q : queries) asked[q] = true;
  Row row;
  for (int64_t h = 0; h < shape.heads; ++h) {
    HeadAttention head;
    head.head = h;
    if (krause) head.sigma = sigma.data_ptr<double>()[h];
    double sink = 0, effective = 0, distance = 0;
    int64_t distance_rows = 0;
    std::vector<double> received(n, 0.0);  // per key: the weight all queries give it
    std::vector<QueryAttention> listed(n);
    for (int64_t i = 0; i < n; ++i) {
      row.clear();
      if (krause) {
        const int64_t* ip = indices.data_ptr<int64_t>() + (h * n + i) * kk;
        const float* wp = weights.data_ptr<float>() + (h * n + i) * kk;
        for (int64_t j = 0; j < kk && ip[j] >= 0; ++j) row.emplace_back(ip[j], wp[j]);
      } else {
        const float* pp = probs.data_ptr<float>() + (h * n + i) * n;
        for (int64_t j = 0; j < n; ++j)
          if (pp[j] > 0) row.emplace_back(j, pp[j]);
      }
      double largest = 0, entropy = 0, total = 0, weighted = 0, placed = 0;
      for (const auto& [key, w] : row) {
        largest = std::max<double>(largest, w);
        if (w > 0) entropy -= static_cast<double>(w) * std::log(static_cast<double>(w));
        total += w;
        received[key] += w;
        if (positions[i].first >= 0 && positions[key].first >= 0) {
          weighted += w * Distance(positions[i], positions[key]);
          placed += w;
        }
      }
      sink += largest;
      effective += std::exp(entropy);
      if (placed > 0) {
        distance += weighted / placed;
        ++distance_rows;
      }
      if (!asked[i]) continue;
      QueryAttention& qa = listed[i];
      qa.query = i;
      const int64_t keep = std::min<int64_t>(out.k, static_cast<int64_t>(row.size()));
      // Krause rows come in the operator's rank order already; softmax rows are ranked here.
      if (!krause) std::partial_sort(row.begin(), row.begin() + keep, row.end(), Ranks);
      double kept = 0;
      for (int64_t j = 0; j < keep; ++j) {
        qa.keys.push_back(row[j].first);
        qa.weights.push_back(row[j].second);
        kept += row[j].second;
      }
      qa.outside = krause ? 0.0f : static_cast<float>(std::max(0.0, total - kept));
    }
    head.sink_share = sink / n;
    head.effective_neighbours = effective / n;
    head.mean_distance = distance_rows > 0 ? distance / distance_rows : 0;
    // The most attended key (the smaller index on a tie) and its share of all the weight.
    const auto busiest = std::max_element(received.begin(), received.end());
    head.busiest_key = busiest - received.begin();
    head.busiest_key_share = *busiest / n;
    head.queries.reserve(queries.size());
    for (int64_t q : queries) head.queries.push_back(listed[q]);
    out.heads.push_back(std::move(head));
  }
  if (rec.q.defined()) {
    out.q = rec.q.detach().cpu();
    out.k_in = rec.k.detach().cpu();
    out.v = rec.v.detach().cpu();
  }
  return out;
}

// Runs `forward` (which fills the trace) and turns the trace into an Inspection.
template <typename Forward>
absl::StatusOr<Inspection> Run(const InspectShape& shape, const InspectOptions& o,
                               std::vector<std::pair<int64_t, int64_t>> positions,
                               Forward forward) {
  std::string field;
  if (absl::Status st = CheckInspectOptions(shape, o, &field); !st.ok()) return st;
  AttentionTrace trace;
  trace.layers = LayersAsked(shape, o);
  trace.keep_inputs = o.keep_inputs;
  Inspection result;
  result.krause = shape.krause;
  result.tokens = shape.tokens;
  result.queries = AllIfEmpty(o.queries, shape.tokens);
  result.positions = std::move(positions);
  try {
    const c10::InferenceMode inference;
    forward(&trace);
    for (const AttentionTrace::Layer& rec : trace.recorded)
      result.layers.push_back(Summarise(rec, shape, o, result.queries, result.positions));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("inspect failed: ", ExceptionMessage(e)));
  }
  return result;
}

}  // namespace

InspectShape InspectShapeOf(const ViT& model) {
  const ViTConfig& c = model.config();
  InspectShape s;
  s.layers = c.depth;
  s.heads = c.heads;
  s.tokens = c.tokens();
  s.krause = c.attention == AttentionKind::kKrause;
  const Neighbourhood nb = Neighbourhood::Grid(c.grid(), c.grid(), c.radius, c.metric, c.cls);
  for (int64_t k : c.TopKSchedule()) {
    s.layer_k.push_back(s.krause ? std::min(k, MaxCandidates(nb, s.tokens)) : k);
  }
  return s;
}

InspectShape InspectShapeOf(const PixelModel& model) {
  const PixelModelConfig& c = model.config();
  InspectShape s;
  s.layers = c.depth;
  s.heads = c.heads;
  s.tokens = c.seq_len();
  s.krause = c.attention == AttentionKind::kKrause;
  const int64_t k =
      s.krause ? std::min(c.top_k, MaxCandidates(Neighbourhood::Causal(c.window), s.tokens))
               : c.top_k;
  s.layer_k.assign(c.depth, k);
  return s;
}

absl::Status CheckInspectOptions(const InspectShape& shape, const InspectOptions& o,
                                 std::string* field) {
  auto fail = [&](std::string f, std::string message) {
    *field = std::move(f);
    return absl::InvalidArgumentError(std::move(message));
  };
  // Each index in [0, count), none twice.
  auto check_list = [&](const std::vector<int64_t>& list, const char* name, int64_t count,
                        const char* what) {
    std::set<int64_t> seen;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string f = absl::StrCat(name, "[", i, "]");
      if (list[i] < 0 || list[i] >= count) {
        return fail(f, absl::StrCat(f, " = ", list[i], " is out of range: the model's ", what,
                                    " are 0 .. ", count - 1));
      }
      if (!seen.insert(list[i]).second)
        return fail(f, absl::StrCat(f, " = ", list[i], " is listed twice"));
    }
    return absl::OkStatus();
  };
  if (absl::Status st = check_list(o.layers, "layers", shape.layers, "layers"); !st.ok()) return st;
  if (absl::Status st = check_list(o.queries, "queries", shape.tokens, "tokens"); !st.ok())
    return st;
  if (shape.krause && o.top_k != 0) {
    return fail("top_k", absl::StrCat("top_k = ", o.top_k,
                                      ": a Krause model lists the keys each layer keeps (its own "
                                      "top_k); top_k is for softmax models, leave it 0"));
  }
  if (o.top_k < 0 || o.top_k > shape.tokens) {
    return fail("top_k",
                absl::StrCat("top_k = ", o.top_k, " is out of range: 0 (the model's k) .. ",
                             shape.tokens, " (its tokens)"));
  }
  const std::vector<int64_t> layers = LayersAsked(shape, o);
  const int64_t queries = o.queries.empty() ? shape.tokens : static_cast<int64_t>(o.queries.size());
  int64_t entries = 0;
  for (int64_t l : layers) entries += queries * shape.heads * ListedK(shape, o, l);
  if (entries > o.max_entries) {
    return fail("queries",
                absl::StrCat("the reply would list ", entries, " keys (", queries, " queries x ",
                             shape.heads, " heads x the keys listed per query, over ",
                             layers.size(), " layers), over the limit of ", o.max_entries,
                             ": ask for fewer queries or layers"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Inspection> InspectClassifier(const ViT& model, const at::Tensor& pixels,
                                             const InspectOptions& o) {
  const ViTConfig& c = model.config();
  if (!pixels.defined() || pixels.dim() != 3 || pixels.size(0) != c.channels ||
      pixels.size(1) != c.image_size || pixels.size(2) != c.image_size ||
      pixels.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError(absl::StrCat("image must be uint8 [C, H, W] = [", c.channels,
                                                   ", ", c.image_size, ", ", c.image_size, "]"));
  }
  std::vector<std::pair<int64_t, int64_t>> positions;
  if (c.cls) positions.emplace_back(-1, -1);
  for (int64_t p = 0; p < c.grid() * c.grid(); ++p)
    positions.emplace_back(p / c.grid(), p % c.grid());
  return Run(InspectShapeOf(model), o, std::move(positions), [&](AttentionTrace* trace) {
    const at::Device device = model.parameters().Get("head.weight").device();
    const at::Tensor x = NormalizePixels(c, pixels.unsqueeze(0).to(device));
    model.Forward(x, ForwardImpl(o.impl), trace);
  });
}

absl::StatusOr<Inspection> InspectGenerator(const PixelModel& model, const at::Tensor& image,
                                            int64_t class_row, const InspectOptions& o) {
  const PixelModelConfig& c = model.config();
  const int64_t n = c.seq_len();
  if (!image.defined() || image.dim() != 1 || image.size(0) != n ||
      image.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError(absl::StrCat("image must be uint8 [N] = [", n, "]"));
  }
  if (class_row >= 0 && !c.conditional()) {
    return absl::InvalidArgumentError("a class was given, but the model is unconditional");
  }
  if (class_row >= c.classes && c.conditional()) {
    return absl::InvalidArgumentError(
        absl::StrCat("class ", class_row, " is out of range: the model has ", c.classes));
  }
  std::vector<std::pair<int64_t, int64_t>> positions;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t s = c.start_token ? t - 1 : t;
    if (s < 0) {
      positions.emplace_back(-1, -1);
    } else {
      const int64_t pixel = s / c.channels;
      positions.emplace_back(pixel / c.width_px, pixel % c.width_px);
    }
  }
  return Run(InspectShapeOf(model), o, std::move(positions), [&](AttentionTrace* trace) {
    at::Tensor u = image.to(at::kLong);
    if (c.start_token) {
      u = at::cat({at::full({1}, PixelModel::kStartToken, at::kLong), u.narrow(0, 0, n - 1)});
    }
    at::Tensor classes;
    if (c.conditional()) {
      classes =
          at::full({1}, class_row >= 0 ? class_row : c.null_class(), at::kLong).to(model.device());
    }
    model.ForwardTokens(u.unsqueeze(0).to(model.device()), ForwardImpl(o.impl), nullptr, classes,
                        trace);
  });
}

}  // namespace krause
