// A served generator (a KARM or its softmax ARM): the ServedModel of kind GENERATOR, with its
// worker (generator_worker.h: the decode engine's thread, Score jobs) and its config (image
// shape, classes, start token).
// Thread-safety: as ServedModel; the worker is thread-safe.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "model/pixel_model.h"
#include "server/core/served_model.h"

namespace krause::server {

// A KvCacheDtype as the engine's cache dtype (EngineOptions::cache_dtype).
at::ScalarType CacheScalarType(KvCacheDtype dtype);

class ServedGenerator final : public ServedModel {
 public:
  static constexpr ModelKind kKind = ModelKind::kGenerator;

  // `model` holds a PixelModel. Creates the decode engine (its KV cache) and starts the worker.
  static absl::StatusOr<std::unique_ptr<ServedModel>> Create(const ModelSpec& spec,
                                                             const LoadedModel& model,
                                                             const WorkerHooks& hooks);

  // Images one request may hold: max_images_per_request, or
  // defaults::kGeneratorImagesPerRequest when 0.
  static int64_t ImagesPerRequest(const ModelSpec& spec);
  // The sampling defaults the model serves with: the checkpoint's metadata
  // ("sampling_defaults"), overridden key by key by the spec's; checked with a request's rules
  // (InvalidArgument naming the model).
  static absl::StatusOr<SamplingDefaults> Defaults(const ModelSpec& spec, const LoadedModel& model);

  const PixelModelConfig& config() const { return pixel_->config(); }
  const PixelModel& pixel() const { return *pixel_; }
  GeneratorWorker& worker() const { return *worker_; }

  absl::Status Score(at::Tensor images, std::vector<int64_t> classes, const CallLimits& limits,
                     ReplyPool* replies, ScoreDone done) override;
  int64_t ScoredPerImage() const override;
  absl::Status Generate(std::vector<GenerationRequest> images,
                        std::shared_ptr<GenerationReceiver> receiver,
                        const Share& share = {}) override;
  void CancelGeneration(const GenerationReceiver* receiver) override { worker_->Cancel(receiver); }
  absl::Status Inspect(at::Tensor image, int64_t class_row, InspectOptions options,
                       const CallLimits& limits, ReplyPool* replies, InspectDone done) override;
  absl::StatusOr<int64_t> ClassRow(bool by_name, const std::string& label, int64_t index,
                                   const std::string& field) const override;

  ModelGauges Gauges() const override;
  absl::Status WarmUp() override;
  void Stop() override { worker_->Stop(); }

 private:
  ServedGenerator(const ModelSpec& spec, const LoadedModel& model,
                  std::unique_ptr<GeneratorWorker> worker);

  std::shared_ptr<const PixelModel> pixel_;
  std::unique_ptr<GeneratorWorker> worker_;
};

}  // namespace krause::server
