// krause.v1 requests into native, validated requests: the request-checking half of the krause.v1
// front end (service.cc has the handlers and the replies, generate_call.cc the Generate stream).
// Every error is InvalidArgument naming the field and the limit, and nothing is queued before a
// request has passed. GenerateParams and ImageRequests are protocol-neutral: any front end that
// fills GenerateParams gets the same images for the same seed.
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
#include "server/served_generator.h"

namespace krause::server {

// Tests only: called at named points ("decode": before each request image or prompt is
// decoded). May be empty.
using FaultHook = std::function<void(const char* point)>;

// A Generate call, validated, in native types.
struct GenerateParams {
  int64_t images = 1;
  std::vector<uint8_t> prompt;  // the first subpixels of every image (whole rows, HWC raster)
  SamplingParams sampling;      // sampling.seed is image 0's: image i is sampled with seed + i
  int64_t label = -1;           // the class, -1 for none
  double guidance = 1.0;
};
// The engine requests of a call's images, image i with seed + i.
std::vector<GenerationRequest> ImageRequests(const GenerateParams& params);

// How a Generate stream sends what it has.
struct StreamParams {
  std::chrono::milliseconds interval{100};  // progress at most this often
  bool rows = true;                         // whole rows as they complete
};

struct ParsedGenerate {
  GenerateParams params;
  StreamParams stream;
};
// Checks, in this order: num_images (0: 1; at most the model's per-request limit), sampling,
// update_interval_ms, the prompt and prompt_rows, the class (label or class_index), guidance;
// then takes the seed (the request's, or a random one).
absl::StatusOr<ParsedGenerate> ParseGenerate(const v1::GenerateRequest& request,
                                             const ServedGenerator& model, const FaultHook& fault);

// A Classify or Score request's images as [n, C, H, W] uint8: 1 to the model's per-request limit,
// each of the model's exact shape.
absl::StatusOr<at::Tensor> DecodeImages(const google::protobuf::RepeatedPtrField<v1::Image>& images,
                                        const ServedModel& model, const FaultHook& fault);

// Score's per-image classes: empty (none), or one per image from `labels` or `class_indices`
// ("" and -1: that image without a class).
absl::StatusOr<std::vector<int64_t>> ScoreClasses(const v1::ScoreRequest& request,
                                                  const ServedGenerator& model, int64_t images);

// A request's one class (the `label` / `class_index` oneof of Generate and Inspect): its row, or
// INVALID_ARGUMENT naming the field that was given ("label: model M: ...").
absl::StatusOr<int64_t> RequestedClass(const ServedGenerator& model, bool by_name,
                                       const std::string& label, int64_t class_index);

}  // namespace krause::server
