#include "server/core/served_classifier.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <future>

#include "absl/strings/str_cat.h"
#include "model/engine/kernel_check.h"
#include "model/util/status_macros.h"
#include "model/vit_cpu.h"
#include "server/core/errors.h"

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
    auto p = CpuViT::Create(*model.vit, spec.precision);
    if (!p.ok()) return WithContext("model " + spec.name, p.status());
    packed = std::move(*p);
  }
  std::unique_ptr<ServedClassifier> m(new ServedClassifier(spec, model));
  if (packed) {
    m->mutable_info().precision = PrecisionName(packed->precision());
    m->mutable_info().precision_fallback = packed->fallback();
    m->mutable_info().linear_kernels = packed->linear_kernels();
  } else if (spec.precision != Precision::kFp32) {
    m->mutable_info().precision_fallback =
        absl::StrCat("the ", spec.attention_impl == "auto" ? "chosen" : spec.attention_impl,
                     " implementation on ", spec.device, " computes in fp32");
  }
  m->mutable_info().max_images_per_request = *images;
  BatchingOptions b;
  b.max_batch_size = spec.max_batch_size;
  b.max_queue_delay = std::chrono::milliseconds(spec.max_queue_delay_ms);
  b.max_queued_images = std::max(spec.max_queued_images, spec.max_batch_size);
  b.attention_impl = *impl;
  std::function<void(const BatchEvent&)> on_batch;
  if (hooks.on_classify_batch)
    on_batch = [f = hooks.on_classify_batch, name = spec.name,
                version = spec.version](const BatchEvent& e) {
      BatchEvent v = e;
      v.version = version;
      f(name, v);
    };
  m->batcher_ = std::make_unique<ClassifyBatcher>(model.vit, spec.device, b, on_batch, packed);
  return m;
}

absl::Status ServedClassifier::WarmUp() {
  const ViTConfig& c = config();
  ClassifyJob job;
  job.images = at::zeros({1, c.channels, c.image_size, c.image_size}, at::kByte);
  std::promise<absl::Status> done;
  job.done = [&done](absl::StatusOr<at::Tensor> probs, double, bool) {
    done.set_value(probs.status());
  };
  if (absl::Status st = batcher_->Enqueue(std::move(job)); !st.ok()) return st;
  return done.get_future().get();
}

ModelGauges ServedClassifier::Gauges() const {
  ModelGauges g;
  g.queued_images = batcher_->queued_images();
  g.tenant_queued_calls = batcher_->tenant_queued_calls();
  return g;
}

absl::Status ServedClassifier::Classify(at::Tensor images, const CallLimits& limits,
                                        ReplyPool* replies, ClassifyDone done) {
  ClassifyJob job;
  job.images = images.permute({0, 3, 1, 2}).contiguous();
  job.deadline = limits.deadline;
  job.cancelled = limits.cancelled;
  job.share = limits.share;
  // With no request queued nothing waits for this thread, and the hop to another thread would
  // only add its wake-up to the call's latency (measured: 0.2-0.3 ms of a 2.5 ms call at
  // concurrency 1), so the batcher replies itself; so it does for a request that cut in, whose
  // reply would otherwise queue behind a batch's (the batcher says which: `reply_here`).
  job.done = [done = std::move(done), replies](absl::StatusOr<at::Tensor> probs, double queue_s,
                                               bool reply_here) {
    if (reply_here) {
      done(std::move(probs), queue_s);
      return;
    }
    replies->Post([done, probs = std::move(probs), queue_s] { done(probs, queue_s); });
  };
  return batcher_->Enqueue(std::move(job));
}

absl::Status ServedClassifier::Inspect(at::Tensor image, int64_t class_row, InspectOptions o,
                                       const CallLimits& limits, ReplyPool* replies,
                                       InspectDone done) {
  if (class_row >= 0) return ClassRow(false, "", class_row, "class_index").status();
  o.impl = batcher_->options().attention_impl;
  std::string field;
  if (absl::Status bad = CheckInspectOptions(InspectShapeOf(*vit_), o, &field); !bad.ok())
    return InvalidField(field, bad.message());
  // The work and its result: computed on the model's thread, replied from the reply pool.
  auto result = std::make_shared<absl::StatusOr<Inspection>>(absl::UnknownError("not run"));
  SideJob job;
  job.deadline = limits.deadline;
  job.cancelled = limits.cancelled;
  job.work = [o, result, pixels = image.permute({2, 0, 1}).contiguous()](const ViT& vit) {
    *result = InspectClassifier(vit, pixels, o);
    return result->status();
  };
  job.done = [result, replies, done = std::move(done)](absl::Status st) {  // why it did not run
    replies->Post([result, st = std::move(st), done] {
      if (st.ok()) {
        done(std::move(*result));
      } else {
        done(st);
      }
    });
  };
  return batcher_->EnqueueSide(std::move(job));
}

}  // namespace krause::server
