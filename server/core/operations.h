// The operations a front end runs on a served model, in native types and free of any protocol.
// A front end converts its wire types into these and the results back, nothing else; the served
// model (served_model.h) carries the operations and dispatches on its kind inside.
//
//   Classify  images [n, H, W, C] uint8 -> probabilities [n, classes] (ClassifyDone)
//   Score     images [n, H, W, C] uint8, classes -> bits/dim per image (ScoreDone)
//   Generate  a GeneratePlan's requests -> a GenerationReceiver's updates (a stream), or, answered
//             once, UnaryGeneration's pixels
//   Inspect   one image [H, W, C] uint8 -> an Inspection (InspectDone)
//
// The rules every front end shares are written here once:
//   - ResolveGenerate: what a generation asks, with the model's defaults for what it leaves out,
//     its limits checked, and the seed rule (ImageSeed);
//   - where a reply is built: `done` runs on the reply pool, except that a classifier whose queue
//     is empty answers on its own thread (the hop would only add its wake-up to the latency);
//   - TopClasses and ClassName: the order and the names of a classification's classes;
//   - UnaryGeneration: the one collector of a generation answered once, with its deadline.
// Thread-safety: pure functions; UnaryGeneration as GenerationReceiver (worker thread).
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
#include "server/core/generator_worker.h"
#include "server/core/model_info.h"
#include "server/core/reply_pool.h"

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

// What a generation asks, as a front end read it; unset settings get the model's defaults.
struct GenerateAsk {
  int64_t images = 1;            // 1 to the model's per-request limit
  std::vector<int64_t> classes;  // empty: none; else one per image (-1: that image has none)
  std::vector<uint8_t> prompt;   // the first subpixels of every image (whole rows, HWC)
  std::optional<double> temperature, top_p, guidance;
  std::optional<int64_t> top_k;  // 0: off (every value may be drawn)
  std::optional<uint64_t> seed;  // unset: a random one
  uint64_t first_image = 0;      // image i is the call's image first_image + i (a resume)
};

// A generation resolved: the engine's requests, image i drawn from ImageSeed(seed,
// first_image + i), and what the call reports.
struct GeneratePlan {
  std::vector<GenerationRequest> images;
  uint64_t seed = 0;  // the call's seed (drawn here when the ask had none)
  uint64_t first_image = 0;
  int64_t passes = 1;  // forward passes per image: 2 with classifier-free guidance
};

// How a streamed generation sends what it has (krause.v1's Generate, the HTTP generate_stream).
struct StreamParams {
  std::chrono::milliseconds interval{100};  // progress at most this often
  bool rows = true;                         // whole rows as they complete
};

// A streamed generation's request, read by its front end: the plan and how it streams.
struct ParsedGenerate {
  GeneratePlan plan;
  StreamParams stream;
};

// The stream's settings: `interval_ms` 0 (100) or in [10, 10000], else InvalidArgument naming
// update_interval_ms; rows unset: true.
absl::StatusOr<StreamParams> ResolveStreamParams(int64_t interval_ms, std::optional<bool> rows);

// A completion prompt's kept subpixels: the first `rows` rows of `prompt` ([h, W, C] uint8, its
// width and channels the model's), with 1 <= rows < the model's height and rows <= h; else
// InvalidArgument naming prompt_rows and the limit.
absl::StatusOr<std::vector<uint8_t>> PromptRows(const at::Tensor& prompt, int64_t rows,
                                                const ModelInfo& model);

// The number of images one generation may ask of `model`: 1 to its per-request limit, else
// InvalidArgument naming num_images and the limit.
absl::Status CheckImageCount(const ModelInfo& model, int64_t images);

// The model's defaults for what `ask` leaves unset, then the checks (CheckImageCount first):
// InvalidArgument with a google.rpc.BadRequest naming the setting ("num_images", "temperature",
// "top_p", "top_k", "guidance"), its message starting with that name and the limit.
absl::StatusOr<GeneratePlan> ResolveGenerate(const ModelInfo& model, GenerateAsk ask);

// A generation answered once (the Open Inference Protocol's infer): collects the images'
// subpixels into [n, H, W, C], stops them at the call's deadline or when its caller leaves, and
// when the last image is done hands `done` the pixels, or the call's status, on the reply pool.
// `on_queued` gets each image's wait for its cache slot (worker thread).
class UnaryGeneration final : public GenerationReceiver,
                              public std::enable_shared_from_this<UnaryGeneration> {
 public:
  using Done = std::function<void(absl::StatusOr<std::string> pixels)>;
  // Submits the plan's images to `model`; an error: nothing was queued and `done` never runs.
  static absl::Status Start(std::shared_ptr<ServedModel> model, GeneratePlan plan,
                            CallLimits limits, Clock::time_point start, ReplyPool* replies,
                            std::function<void(double seconds)> on_queued, Done done);

  void OnUpdate(const CallUpdate& update) override;  // worker thread

 private:
  UnaryGeneration() = default;
  void Finish();  // reply pool, once

  std::shared_ptr<ServedModel> model_;
  CallLimits limits_;
  Clock::time_point start_;
  ReplyPool* replies_ = nullptr;
  std::function<void(double)> on_queued_;
  Done done_;
  int64_t per_image_ = 0;
  // Worker thread only (then the reply pool, after the last update).
  std::string pixels_;
  std::vector<absl::Status> status_;
  int64_t left_ = 0;
  bool stopped_ = false, stopping_ = false;
  absl::Status why_;
};

}  // namespace krause::server
