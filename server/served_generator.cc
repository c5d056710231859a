#include "server/served_generator.h"

#include "absl/strings/str_cat.h"
#include "model/util/status_macros.h"
#include "server/defaults.h"

namespace krause::server {
namespace {

// The engine's own default (model/ cannot see server/defaults.h) must be the server's.
static_assert(EngineOptions{}.max_sequences == defaults::kMaxSequences);

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

}  // namespace

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
}

absl::StatusOr<std::unique_ptr<ServedModel>> ServedGenerator::Create(const ModelSpec& spec,
                                                                     const LoadedModel& model,
                                                                     const WorkerHooks& hooks) {
  GeneratorOptions g;
  g.engine.max_sequences = spec.max_sequences;
  g.max_waiting = spec.max_waiting;
  g.engine.cuda_graphs = spec.cuda_graphs;
  g.engine.cache_dtype = CacheScalarType(spec.kv_cache_dtype);
  std::function<void(const DecodeEvent&)> on_step;
  if (hooks.on_decode_step)
    on_step = [f = hooks.on_decode_step, name = spec.name](const DecodeEvent& e) { f(name, e); };
  auto worker = GeneratorWorker::Create(model.pixel, g, std::move(on_step));
  if (!worker.ok()) return WithContext("model " + spec.name, worker.status());
  return std::unique_ptr<ServedModel>(new ServedGenerator(spec, model, std::move(*worker)));
}

ModelGauges ServedGenerator::Gauges() const {
  ModelGauges g;
  g.queued_images = worker_->waiting();
  ModelGauges::Cache& c = g.cache.emplace();
  c.active_sequences = worker_->active();
  c.slots = worker_->slots();
  c.slots_in_use = worker_->slots_in_use();
  c.bytes_per_slot = worker_->bytes_per_sequence();
  return g;
}

}  // namespace krause::server
