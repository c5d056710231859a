#include "server/core/served_generator.h"

#include <ATen/ATen.h>

#include <future>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "model/engine/kernel_check.h"
#include "model/util/status_macros.h"
#include "server/core/defaults.h"
#include "server/core/errors.h"

namespace krause::server {
namespace {

// The engine's own default (model/ cannot see server/core/defaults.h) must be the server's.
static_assert(EngineOptions{}.max_sequences == defaults::kMaxSequences);

}  // namespace

at::ScalarType CacheScalarType(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kBFloat16:
      return at::kBFloat16;
    case KvCacheDtype::kFloat16:
      return at::kHalf;
    case KvCacheDtype::kFloat32:
      break;
  }
  return at::kFloat;
}

int64_t ServedGenerator::ImagesPerRequest(const ModelSpec& spec) {
  return spec.max_images_per_request > 0 ? spec.max_images_per_request
                                         : defaults::kGeneratorImagesPerRequest;
}

ServedGenerator::ServedGenerator(const ModelSpec& spec, const LoadedModel& model,
                                 std::unique_ptr<GeneratorWorker> worker)
    : ServedModel(spec, model, kKind), pixel_(model.pixel), worker_(std::move(worker)) {
  const PixelModelConfig& c = pixel_->config();
  ModelInfo& info = mutable_info();
  info.attention = c.attention;
  if (c.attention == AttentionKind::kKrause) {
    info.window = c.window;
    info.top_k.assign(c.depth, c.top_k);
  }
  info.classes = c.classes;
  info.labels = c.labels;
  info.shape = {c.height, c.width_px, c.channels};
  info.max_images_per_request = ImagesPerRequest(spec);
  info.max_batch_size = worker_->slots();
  info.kv_cache_bytes_per_sequence = worker_->bytes_per_sequence();
  info.kv_cache_dtype = KvCacheDtypeName(spec.kv_cache_dtype);
}

absl::StatusOr<SamplingDefaults> ServedGenerator::Defaults(const ModelSpec& spec,
                                                           const LoadedModel& model) {
  SamplingDefaults d;
  if (const auto it = model.metadata.find("sampling_defaults"); it != model.metadata.end()) {
    const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, false);
    const std::string where =
        absl::StrCat("model ", spec.name, ": ", model.path, " metadata sampling_defaults");
    if (j.is_discarded() || !j.is_object())
      return absl::InvalidArgumentError(where + " is not a JSON object");
    if (absl::Status st = ReadSamplingDefaults(j, where, &d); !st.ok()) return st;
  }
  const SamplingDefaults& s = spec.sampling;
  if (s.temperature) d.temperature = s.temperature;
  if (s.top_p) d.top_p = s.top_p;
  if (s.top_k) d.top_k = s.top_k;
  if (s.guidance) d.guidance = s.guidance;
  // The request's own rules.
  SamplingParams p;
  p.temperature = d.temperature.value_or(p.temperature);
  p.top_p = d.top_p.value_or(p.top_p);
  p.top_k = d.top_k.value_or(p.top_k);
  absl::Status st = ValidateSampling(p);
  if (st.ok() && d.guidance) {
    if (model.pixel->config().classes == 0 && *d.guidance != 1.0)
      st = absl::InvalidArgumentError("guidance needs a conditional model");
    else
      st = ValidateGuidance(*d.guidance, /*label=*/0);
  }
  if (!st.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("model ", spec.name, ": sampling default: ", st.message()));
  return d;
}

absl::StatusOr<std::unique_ptr<ServedModel>> ServedGenerator::Create(const ModelSpec& spec,
                                                                     const LoadedModel& model,
                                                                     const WorkerHooks& hooks) {
  auto sampling = Defaults(spec, model);
  if (!sampling.ok()) return sampling.status();
  GeneratorOptions g;
  g.engine.max_sequences = spec.max_sequences;
  g.max_waiting = spec.max_waiting;
  g.engine.cuda_graphs = spec.cuda_graphs;
  g.engine.cache_dtype = CacheScalarType(spec.kv_cache_dtype);
  auto impl = ParseServingImpl(spec.attention_impl);
  if (!impl.ok()) return WithContext("model " + spec.name, impl.status());
  g.engine.attention_impl = *impl;
  g.engine.precision = spec.precision;
  std::function<void(const DecodeEvent&)> on_step;
  if (hooks.on_decode_step)
    on_step = [f = hooks.on_decode_step, name = spec.name,
               version = spec.version](const DecodeEvent& e) {
      DecodeEvent v = e;
      v.version = version;
      f(name, v);
    };
  auto worker = GeneratorWorker::Create(model.pixel, g, std::move(on_step));
  if (!worker.ok()) return WithContext("model " + spec.name, worker.status());
  std::unique_ptr<ServedGenerator> served(new ServedGenerator(spec, model, std::move(*worker)));
  ModelInfo& info = served->mutable_info();
  info.precision = PrecisionName(served->worker_->precision());
  info.precision_fallback = served->worker_->precision_fallback();
  info.linear_kernels = served->worker_->linear_kernels();
  info.default_temperature = sampling->temperature;
  info.default_top_p = sampling->top_p;
  info.default_top_k = sampling->top_k;
  info.default_guidance = sampling->guidance;
  return std::unique_ptr<ServedModel>(std::move(served));
}

absl::Status ServedGenerator::WarmUp() {
  ScoreJob job;
  const ImageShape& shape = info().shape;
  job.images = at::zeros({1, shape.height * shape.width * shape.channels}, at::kByte);
  std::promise<absl::Status> done;
  job.done = [&done](absl::StatusOr<std::vector<double>> bpd) { done.set_value(bpd.status()); };
  if (absl::Status st = worker_->EnqueueScore(std::move(job)); !st.ok()) return st;
  return done.get_future().get();
}

ModelGauges ServedGenerator::Gauges() const {
  ModelGauges g;
  g.queued_images = worker_->waiting();
  g.tenant_queued_calls = worker_->tenant_queued_calls();
  ModelGauges::Cache& c = g.cache.emplace();
  c.active_sequences = worker_->active();
  c.slots = worker_->slots();
  c.slots_in_use = worker_->slots_in_use();
  c.bytes_per_slot = worker_->bytes_per_sequence();
  return g;
}

absl::Status ServedGenerator::Score(at::Tensor images, std::vector<int64_t> classes,
                                    const CallLimits& limits, ReplyPool* replies, ScoreDone done) {
  ScoreJob job;
  const int64_t n = images.size(0);
  job.images = images.reshape({n, -1}).contiguous();  // the HWC raster order
  job.labels = std::move(classes);
  job.deadline = limits.deadline;
  job.cancelled = limits.cancelled;
  job.done = [replies, done = std::move(done)](absl::StatusOr<std::vector<double>> bpd) {
    replies->Post([done, bpd = std::move(bpd)] { done(bpd); });
  };
  return worker_->EnqueueScore(std::move(job));
}

int64_t ServedGenerator::ScoredPerImage() const {
  const PixelModelConfig& c = config();
  return c.seq_len() - (c.start_token ? 0 : 1);
}

absl::Status ServedGenerator::Generate(std::vector<GenerationRequest> images,
                                       std::shared_ptr<GenerationReceiver> receiver,
                                       const Share& share) {
  return worker_->Submit(std::move(images), std::move(receiver), share);
}

absl::Status ServedGenerator::Inspect(at::Tensor image, int64_t class_row, InspectOptions o,
                                      const CallLimits& limits, ReplyPool* replies,
                                      InspectDone done) {
  std::string field;
  if (absl::Status bad = CheckInspectOptions(InspectShapeOf(*pixel_), o, &field); !bad.ok())
    return InvalidField(field, bad.message());
  auto result = std::make_shared<absl::StatusOr<Inspection>>(absl::UnknownError("not run"));
  ScoreJob job;
  job.images = image.reshape({1, -1}).contiguous();  // the raster order, as Score
  job.deadline = limits.deadline;
  job.cancelled = limits.cancelled;
  job.work = [o, result, class_row, raster = job.images[0]](const PixelModel& model,
                                                            KrauseImpl impl) mutable {
    o.impl = impl;
    *result = InspectGenerator(model, raster, class_row, o);
    return result->status();
  };
  job.done = [result, replies, done = std::move(done)](absl::StatusOr<std::vector<double>> r) {
    replies->Post([result, st = r.status(), done] {  // the work's status, or why it did not run
      if (st.ok()) {
        done(std::move(*result));
      } else {
        done(st);
      }
    });
  };
  return worker_->EnqueueScore(std::move(job));
}

absl::StatusOr<int64_t> ServedGenerator::ClassRow(bool by_name, const std::string& label,
                                                  int64_t index, const std::string& field) const {
  const PixelModelConfig& c = config();
  auto cls = by_name ? c.ClassOfLabel(label)
             : index < -1
                 ? absl::InvalidArgumentError(absl::StrCat("class ", index, " is below -1 (none)"))
                 : c.ClassRow(index);
  if (cls.ok()) return cls;
  return InvalidField(field, absl::StrCat(field, ": model ", name(), ": ", cls.status().message()));
}

}  // namespace krause::server
