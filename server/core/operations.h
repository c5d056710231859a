// The operations a front end runs on a served model, in native types and free of any protocol.
// A front end converts its wire types into these and the results back, nothing else; the served
// model (served_model.h) carries the operations and dispatches on its kind inside.
//
//   Classify  images [n, H, W, C] uint8 -> probabilities [n, classes] (ClassifyDone)
//   Score     images [n, H, W, C] uint8, classes -> bits/dim per image (ScoreDone)
//   Generate  a GeneratePlan's requests -> a GenerationReceiver's updates (the collector,
//             edge/generation_collector.h, streams them or answers once)
//   Inspect   one image [H, W, C] uint8 -> an Inspection (InspectDone)
//
// The rules every front end shares are written here once:
//   - ResolveGenerate: a generation's settings (generate_settings.h) with the model's defaults for
//     what they leave out, its limits checked, and the seed rule (ImageSeed);
//   - where a reply is built: `done` runs on the reply pool, except that a classifier whose queue
//     is empty answers on its own thread (the hop would only add its wake-up to the latency);
//   - TopClasses and ClassName: the order and the names of a classification's classes.
// Thread-safety: pure functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/engine/decode_engine.h"
#include "model/engine/inspect.h"
#include "server/core/generate_settings.h"
#include "server/core/generator_worker.h"
#include "server/core/model_info.h"
#include "server/core/reply_pool.h"
#include "server/core/tenants.h"

namespace krause::server {

class ServedModel;

// Tests only: called at named points of a call ("decode": before each request image or prompt is
// decoded; "reply": before a reply is built; "flush": before a Generate message is built), e.g.
// to throw and check that the call still ends with INTERNAL. May be empty.
using FaultHook = std::function<void(const char* point)>;

// What a call lends to the work it queues: when the call ends, and whether its caller left.
struct CallLimits {
  Clock::time_point deadline = Clock::time_point::max();
  std::function<bool()> cancelled;  // polled while the work waits or runs; may be empty
  Share share;                      // the call's tenant and priority (the schedulers' shares)
};

// Probabilities [n, classes] (float, CPU) and the time the images waited for their batch.
using ClassifyDone = std::function<void(absl::StatusOr<at::Tensor>, double queue_seconds)>;
// Bits per dimension, one per image.
using ScoreDone = std::function<void(absl::StatusOr<std::vector<double>>)>;
using InspectDone = std::function<void(absl::StatusOr<Inspection>)>;

// The k classes of one row of probabilities with the highest probability, highest first; ties go
// to the lower index (so the first of TopClasses(row, n, 1) is the argmax's first).
std::vector<int64_t> TopClasses(const float* row, int64_t classes, int64_t k);
// A class's label, or its index as text when the model has no label for it.
std::string ClassName(const ModelInfo& info, int64_t index);

// The random stream of image `image` of a call with seed `seed`: image 0 keeps the seed itself
// (a one-image call with seed s is the image s names), every other image a SplitMix64 mix of
// both, so the calls with seeds 7 and 8 share no image (seed + i would share all but one).
uint64_t ImageSeed(uint64_t seed, uint64_t image);

// A generation resolved: the engine's requests, image i drawn from ImageSeed(seed,
// first_image + i), how the answer goes out, and what the call reports.
struct GeneratePlan {
  std::vector<GenerationRequest> images;
  uint64_t seed = 0;  // the call's seed (drawn here when the settings had none)
  uint64_t first_image = 0;
  int64_t passes = 1;  // forward passes per image: 2 with classifier-free guidance
  GenerateOutput output = GenerateOutput::kRows;
  std::chrono::milliseconds interval{100};  // progress at most this often (streams)
  std::chrono::microseconds timeout{0};     // 0: the call's own deadline only
};

// A class by label or index, as a served model resolves it (ServedModel::ClassRow): the model's
// class row, or InvalidArgument naming `field`.
using ClassLookup = std::function<absl::StatusOr<int64_t>(bool by_name, const std::string& label,
                                                          int64_t index, const std::string& field)>;

// A completion prompt's kept subpixels: the first `rows` rows of `prompt` ([h, W, C] uint8, its
// width and channels the model's), with 1 <= rows < the model's height and rows <= h; else
// InvalidArgument naming prompt_rows and the limit.
absl::StatusOr<std::vector<uint8_t>> PromptRows(const at::Tensor& prompt, int64_t rows,
                                                const ModelInfo& model);

// The number of images one generation may ask of `model`: 1 to its per-request limit, else
// InvalidArgument naming num_images and the limit.
absl::Status CheckImageCount(const ModelInfo& model, int64_t images);

// The one resolution of a generation's settings against a model, in this order (a request wrong
// in two ways gets the same error from every front end): the number of images (CheckImageCount),
// the streaming settings (update_interval_ms 0 or in [10, 10000]), the prompt (decoded within the
// model's bounds, `fault("decode")` first; prompt_rows checked by PromptRows), the class (label or
// class_index through `classes`), then the model's defaults for what is unset and the sampling
// settings and guidance checked, and the seed (the settings', or a random one). Errors are
// InvalidArgument with a google.rpc.BadRequest naming the setting ("num_images",
// "update_interval_ms", the prompt's field, "prompt_rows", "label", "class_index",
// "temperature", "top_p", "top_k", "guidance"), the message starting with its name and the limit.
absl::StatusOr<GeneratePlan> ResolveGenerate(const GenerateSettings& settings,
                                             const ModelInfo& model, const ClassLookup& classes,
                                             const FaultHook& fault = {});
// The same against a served model (its classes).
absl::StatusOr<GeneratePlan> ResolveGenerate(const GenerateSettings& settings,
                                             const ServedModel& model, const FaultHook& fault);

}  // namespace krause::server
