// A served classifier (a Krause ViT or its softmax baseline): the ServedModel of kind CLASSIFIER,
// with its dynamic batcher (classify_batcher.h) and its config (labels, classes, image size).
// Thread-safety: as ServedModel; the batcher is thread-safe.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "model/vit.h"
#include "server/core/served_model.h"

namespace krause::server {

class ServedClassifier final : public ServedModel {
 public:
  static constexpr ModelKind kKind = ModelKind::kClassifier;

  // `model` holds a ViT. Builds the packed CPU forward (on the CPU) and starts the batcher.
  // InvalidArgument naming the model for a generator's option or too many images per request.
  static absl::StatusOr<std::unique_ptr<ServedModel>> Create(const ModelSpec& spec,
                                                             const LoadedModel& model,
                                                             const WorkerHooks& hooks);

  // Images one request may hold: max_images_per_request, or max_batch_size when 0; over
  // max_batch_size is InvalidArgument (a request is never split over batches).
  static absl::StatusOr<int64_t> ImagesPerRequest(const ModelSpec& spec);

  const ViTConfig& config() const { return vit_->config(); }
  const ViT& vit() const { return *vit_; }
  ClassifyBatcher& batcher() const { return *batcher_; }

  // The rule for where the reply is built (operations.h): on the batcher's thread when no
  // request waits behind this one, else on the reply pool so that the next batch starts at once.
  absl::Status Classify(at::Tensor images, const CallLimits& limits, ReplyPool* replies,
                        ClassifyDone done) override;
  absl::Status Inspect(at::Tensor image, int64_t class_row, InspectOptions options,
                       const CallLimits& limits, ReplyPool* replies, InspectDone done) override;

  int64_t Classes() const override { return config().classes; }

  ModelGauges Gauges() const override;
  absl::Status WarmUp() override;
  void Stop() override { batcher_->Stop(); }

 private:
  ServedClassifier(const ModelSpec& spec, const LoadedModel& model);

  std::shared_ptr<const ViT> vit_;
  std::unique_ptr<ClassifyBatcher> batcher_;
};

}  // namespace krause::server
