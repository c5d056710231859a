// What a model's attention keeps on one input: for each layer and head, the keys each query kept
// and their weights, and three summary figures per head. The Inspect RPC and `krause-eval
// attention` are built on it.
//
// The figures come from the forward the model serves with (its serving implementation of the
// operator, recorded by AttentionTrace from the same call that computes the layer's output):
//   Krause layers: the kept keys in the operator's rank order (score descending; on a tie the
//     larger key index first) and their softmax weights; they sum to 1.
//   Softmax layers: every key has a weight; the listed keys are the `top_k` largest (the same
//     order and tie rule), and `outside` is the weight of the keys not listed.
//
// Tokens. A classifier (ViT): 0 is the CLS token, 1 .. G*G the patches in row-major order. A
// generator: the model's input positions 0 .. N-1 (N = height * width * channels); without a
// start token position t holds subpixel t of the image; with one, position 0 holds the start
// token and position t >= 1 holds subpixel t-1 (position t predicts subpixel t).
//
// Summary figures, per layer and head, over every query of the input (whatever `queries` lists):
//   sink_share           mean over queries of the largest single weight: 1 when every query
//                        puts all its weight on one key (an attention sink), 1/n for uniform
//                        attention over n keys;
//   mean_distance        mean over queries of the weighted mean distance to the keys, in patches
//                        (classifiers) or pixels (generators; subpixels of one pixel are 0 apart),
//                        Euclidean on the grid; the CLS and start tokens have no position and are
//                        left out of it (as queries, and as keys, with the other keys' weights
//                        renormalised);
//   effective_neighbours mean over queries of exp(entropy of the weights): the number of keys a
//                        query effectively listens to;
//   busiest_key,         the key that receives the most weight summed over all queries (the
//   busiest_key_share    smaller index on a tie), and that sum over the number of queries: the
//                        share of the whole layer's attention one key takes. An attention sink
//                        (a start token, a CLS token, a blank patch every query dumps its
//                        weight on) shows as a large share; a local pattern keeps it small.
// Thread-safety: pure functions of a const model.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/attention/krause_attention.h"
#include "model/pixel_model.h"
#include "model/vit.h"

namespace krause {

struct InspectOptions {
  std::vector<int64_t> layers;   // empty: every layer
  std::vector<int64_t> queries;  // token indices (see above), no repeats; empty: every token
  // Softmax models: the keys listed per query, 1 .. tokens; 0: the layer's k of the model's
  // config (the k its Krause counterpart keeps). Krause models list what they keep: must be 0.
  int64_t top_k = 0;
  // The bound on the listing: queries x heads x keys listed per query, summed over the layers
  // (the server's --inspect_max_entries); none by default.
  int64_t max_entries = std::numeric_limits<int64_t>::max();
  // The serving implementation (engine/kernel_check.h's choice; ForwardImpl applies).
  KrauseImpl impl = KrauseImpl::kAuto;
  // Also record each layer's q, k, v (tests re-run the reference operator on them).
  bool keep_inputs = false;
};

struct QueryAttention {
  int64_t query = 0;
  std::vector<int64_t> keys;  // rank order
  std::vector<float> weights;
  float outside = 0;  // weight on keys not listed (0 for Krause layers)
};

struct HeadAttention {
  int64_t head = 0;
  double sigma = 0;  // Krause: exp(log_sigma) of the head; 0 for softmax
  double sink_share = 0, mean_distance = 0, effective_neighbours = 0;
  int64_t busiest_key = 0;
  double busiest_key_share = 0;
  std::vector<QueryAttention> queries;  // the requested queries, in request order
};

struct LayerAttention {
  int64_t layer = 0;
  int64_t k = 0;  // keys listed per query (Krause: the layer's top_k)
  std::vector<HeadAttention> heads;
  at::Tensor q, k_in, v;  // keep_inputs only: [1, H, N, d]
};

struct Inspection {
  bool krause = false;
  int64_t tokens = 0;
  std::vector<int64_t> queries;  // as listed in every head (all tokens when none were asked)
  std::vector<LayerAttention> layers;
  // Each token's grid position (row, column; patches or pixels), or (-1, -1) for CLS / start.
  std::vector<std::pair<int64_t, int64_t>> positions;
};

// The shape Inspect's options are checked against.
struct InspectShape {
  int64_t layers = 0, heads = 0, tokens = 0;
  bool krause = false;
  std::vector<int64_t> layer_k;  // per layer: keys listed per query when top_k is 0
};
InspectShape InspectShapeOf(const ViT& model);
InspectShape InspectShapeOf(const PixelModel& model);

// OK, or INVALID_ARGUMENT naming the limit, with *field set to the request's field ("layers[1]",
// "queries[0]", "top_k", "queries" for the size of the reply).
absl::Status CheckInspectOptions(const InspectShape& shape, const InspectOptions& options,
                                 std::string* field);

// pixels: [C, H, W] uint8 (the model's shape; CPU). Errors: CheckInspectOptions's.
absl::StatusOr<Inspection> InspectClassifier(const ViT& model, const at::Tensor& pixels,
                                             const InspectOptions& options);
// image: [N] uint8 subpixels in raster order. class_row: a class of a conditional model
// (0 .. classes-1), or -1 for none (the null class).
absl::StatusOr<Inspection> InspectGenerator(const PixelModel& model, const at::Tensor& image,
                                            int64_t class_row, const InspectOptions& options);

}  // namespace krause
