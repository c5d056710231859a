// krause.v1 requests into native, validated requests: the request-checking half of the krause.v1
// front end (service.cc has the handlers and the replies, generate_call.cc the Generate stream).
// Every error is InvalidArgument naming the field and the limit, and nothing is queued before a
// request has passed. The rules themselves (defaults, limits, seeds) are the core's
// (operations.h), shared with the other front ends.
// Thread-safety: pure functions (the fault hook aside).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "krause/v1/krause.pb.h"
#include "model/engine/decode_engine.h"
#include "server/core/operations.h"
#include "server/core/served_model.h"

namespace krause::server {

// Reads, in this order: num_images (0: 1), update_interval_ms, the prompt and prompt_rows, the
// class (label or class_index); then ResolveGenerate (operations.h) applies the model's defaults
// and checks the sampling settings and guidance, and takes the seed (the request's, or a random
// one).
absl::StatusOr<ParsedGenerate> ParseGenerate(const v1::GenerateRequest& request,
                                             const ServedModel& model, const FaultHook& fault);

// A Classify or Score request's images as [n, H, W, C] uint8: 1 to the model's per-request
// limit, each of the model's exact shape.
absl::StatusOr<at::Tensor> DecodeImages(const google::protobuf::RepeatedPtrField<v1::Image>& images,
                                        const ServedModel& model, const FaultHook& fault);

// Score's per-image classes: empty (none), or one per image from `labels` or `class_indices`
// ("" and -1: that image without a class).
absl::StatusOr<std::vector<int64_t>> ScoreClasses(const v1::ScoreRequest& request,
                                                  const ServedModel& model, int64_t images);

}  // namespace krause::server
