#include "server/served_classifier.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <future>

#include "absl/strings/str_cat.h"
#include "model/engine/kernel_check.h"
#include "model/util/status_macros.h"
#include "model/vit_cpu.h"

namespace krause::server {

absl::StatusOr<int64_t> ServedClassifier::ImagesPerRequest(const ModelSpec& spec) {
  if (spec.max_images_per_request > spec.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", spec.name, ": max_images_per_request (", spec.max_images_per_request,
        ") is over max_batch_size (", spec.max_batch_size,
        "); a request is never split over batches, so lower it or raise max_batch_size"));
  }
  return spec.max_images_per_request > 0 ? spec.max_images_per_request : spec.max_batch_size;
}

ServedClassifier::ServedClassifier(const ModelSpec& spec, const LoadedModel& model)
    : ServedModel(spec, model, kKind), vit_(model.vit) {
  const ViTConfig& c = vit_->config();
  ModelInfo& info = mutable_info();
  info.attention = c.attention;
  info.labels = c.labels;
  if (c.attention == AttentionKind::kKrause) {
    info.window = c.radius;
    info.top_k = c.TopKSchedule();
  }
  info.shape = {c.image_size, c.image_size, c.channels};
  info.max_batch_size = spec.max_batch_size;
  info.max_queue_delay_ms = spec.max_queue_delay_ms;
}

absl::StatusOr<std::unique_ptr<ServedModel>> ServedClassifier::Create(const ModelSpec& spec,
                                                                      const LoadedModel& model,
                                                                      const WorkerHooks& hooks) {
  if (!spec.sampling.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", spec.name,
                     ": temperature, top_p, top_k and guidance are a generator's options (this "
                     "is a classifier)"));
  }
  if (spec.kv_cache_dtype != KvCacheDtype::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", spec.name, ": kv_cache_dtype is a generator's option (this is a classifier)"));
  }
  auto images = ImagesPerRequest(spec);
  if (!images.ok()) return images.status();
  auto impl = ParseServingImpl(spec.attention_impl);
  if (!impl.ok()) return WithContext("model " + spec.name, impl.status());
  std::shared_ptr<const CpuViT> packed;
  if (at::Device(spec.device).is_cpu() &&
      (*impl == KrauseImpl::kAuto || *impl == KrauseImpl::kFusedCpu)) {
    // the packed forward the CPU batcher runs
    auto p = CpuViT::Create(*model.vit);
    if (!p.ok()) return WithContext("model " + spec.name, p.status());
    packed = std::move(*p);
  }
  std::unique_ptr<ServedClassifier> m(new ServedClassifier(spec, model));
  m->mutable_info().max_images_per_request = *images;
  BatchingOptions b;
  b.max_batch_size = spec.max_batch_size;
  b.max_queue_delay = std::chrono::milliseconds(spec.max_queue_delay_ms);
  b.max_queued_images = std::max(spec.max_queued_images, spec.max_batch_size);
  b.attention_impl = *impl;
  std::function<void(const BatchEvent&)> on_batch;
  if (hooks.on_classify_batch)
    on_batch = [f = hooks.on_classify_batch, name = spec.name](const BatchEvent& e) { f(name, e); };
  m->batcher_ = std::make_unique<ClassifyBatcher>(model.vit, spec.device, b, on_batch, packed);
  return m;
}

absl::Status ServedClassifier::WarmUp() {
  const ViTConfig& c = config();
  ClassifyJob job;
  job.images = at::zeros({1, c.channels, c.image_size, c.image_size}, at::kByte);
  std::promise<absl::Status> done;
  job.done = [&done](absl::StatusOr<at::Tensor> probs, double) { done.set_value(probs.status()); };
  if (absl::Status st = batcher_->Enqueue(std::move(job)); !st.ok()) return st;
  return done.get_future().get();
}

ModelGauges ServedClassifier::Gauges() const {
  ModelGauges g;
  g.queued_images = batcher_->queued_images();
  return g;
}

}  // namespace krause::server
