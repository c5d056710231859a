// krause-client inspect IMAGE: what a model's attention keeps on one image (the Inspect RPC).
//   heatmaps (default): one PNG per query, DIR/inspect-q<Q>.png: the input image, then one tile
//     per layer (rows) and head (columns), each the query's attention weights over the image's
//     grid (patches or pixels) in a black-red-yellow-white ramp over the dimmed image, scaled to
//     the tile's largest weight; the query's own cell outlined in cyan; for a generator, the
//     pixels after the query (which it cannot see) tinted blue. Without --query: the centre token.
//   --summary: the per-layer, per-head table (sigma, sink share, mean distance, effective
//     neighbours), over every query of the image.
//   --json: the reply as JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/connection.h"
#include "krause/v1/krause.grpc.pb.h"

namespace krause::client {

struct InspectArgs {
  std::string model, version;
  std::vector<int64_t> layers, heads, queries;  // empty: every layer / head; the centre token
  int64_t top_k = 0;                            // softmax models
  std::string label;                            // conditional generators: a class by name ...
  int64_t class_index = -1;                     // ... or by index
  std::string out = ".";
  bool summary = false, as_json = false;
};

// `image`: the request image; `name`: how the input is called in messages. Exit code: 0, 1 on
// an error.
int Inspect(v1::KrauseService::Stub& stub, const ConnectionOptions& o, const v1::Image& image,
            const std::string& name, const InspectArgs& args);

// "1,3,5" -> {1, 3, 5} (empty -> {}); InvalidArgument naming `flag` on anything else.
absl::StatusOr<std::vector<int64_t>> ParseIndexList(const std::string& text, const char* flag);

}  // namespace krause::client
