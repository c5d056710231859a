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
#include "server/core/generate_settings.h"
#include "server/core/operations.h"
#include "server/core/served_model.h"

namespace krause::server {

// A Generate request's settings (core/generate_settings.h), each krause.v1 field mapped to its
// setting here and nowhere else; ResolveGenerate (operations.h) checks them against the model.
// InvalidArgument only for a prompt Image with neither png nor raw data.
absl::StatusOr<GenerateSettings> SettingsOf(const v1::GenerateRequest& request);

// A Classify or Score request's images as [n, H, W, C] uint8: 1 to the model's per-request
// limit, each of the model's exact shape.
absl::StatusOr<at::Tensor> DecodeImages(const google::protobuf::RepeatedPtrField<v1::Image>& images,
                                        const ServedModel& model, const FaultHook& fault);

// Score's per-image classes: empty (none), or one per image from `labels` or `class_indices`
// ("" and -1: that image without a class).
absl::StatusOr<std::vector<int64_t>> ScoreClasses(const v1::ScoreRequest& request,
                                                  const ServedModel& model, int64_t images);

}  // namespace krause::server
