#include "server/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// The model's description, once its worker exists (shape and limits set by Load).
void Describe(ServedModel* m) {
  ModelInfo& info = m->info;
  info.name = m->spec.name;
  info.device = m->spec.device;
  info.checkpoint = m->model.path;
  const auto summary = m->model.metadata.find("summary");
  if (summary != m->model.metadata.end()) info.summary = summary->second;
  info.parameters = m->model.NumParameters();
  info.flops_per_image_executed = m->flops.executed_flops;
  info.flops_per_image_dense_equivalent = m->flops.dense_equivalent_flops;
  if (m->model.classifier()) {
    const ViTConfig& c = m->model.vit->config();
    info.kind = ModelKind::kClassifier;
    info.attention = c.attention;
    const bool krause = c.attention == AttentionKind::kKrause;
    info.labels = c.labels;
    if (krause) {
      info.window = c.radius;
      info.top_k = c.TopKSchedule();
    }
    info.max_batch_size = m->spec.max_batch_size;
    info.max_queue_delay_ms = m->spec.max_queue_delay_ms;
  } else {
    const PixelModelConfig& c = m->model.pixel->config();
    info.kind = ModelKind::kGenerator;
    info.attention = c.attention;
    const bool krause = c.attention == AttentionKind::kKrause;
    if (krause) {
      info.window = c.window;
      info.top_k.assign(c.depth, c.top_k);
    }
    info.classes = c.classes;
    info.labels = c.labels;
    info.max_batch_size = m->generator->slots();
    info.kv_cache_bytes_per_sequence = m->generator->bytes_per_sequence();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Registry>> Registry::Load(const std::vector<ModelSpec>& specs,
                                                         const WorkerHooks& hooks) {
  auto reg = std::make_unique<Registry>();
  bool default_classifier = false, default_generator = false;
  for (const ModelSpec& spec : specs) {
    auto m = std::make_unique<ServedModel>();
    m->spec = spec;
    auto loaded = LoadModel(spec.checkpoint, spec.device);
    if (!loaded.ok())
      return absl::Status(loaded.status().code(),
                          absl::StrCat("model ", spec.name, ": ", loaded.status().message()));
    m->model = std::move(*loaded);
    m->flops = m->model.FlopsPerImage();
    const std::string name = spec.name;
    if (m->model.classifier() && spec.kv_cache_dtype != KvCacheDtype::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", spec.name, ": kv_cache_dtype is a generator's option (this is a classifier)"));
    }
    if (m->model.classifier()) {
      const ViTConfig& c = m->model.vit->config();
      m->info.shape = {c.image_size, c.image_size, c.channels};
      ASSIGN_OR_RETURN(m->info.max_images_per_request,
                       ImagesPerRequest(spec, ModelKind::kClassifier));
      BatchingOptions b;
      b.max_batch_size = spec.max_batch_size;
      b.max_queue_delay = std::chrono::milliseconds(spec.max_queue_delay_ms);
      b.max_queued_images = std::max(spec.max_queued_images, spec.max_batch_size);
      std::function<void(const BatchEvent&)> on_batch;
      if (hooks.on_classify_batch)
        on_batch = [f = hooks.on_classify_batch, name](const BatchEvent& e) { f(name, e); };
      std::shared_ptr<const CpuViT> packed;
      if (at::Device(spec.device).is_cpu()) {  // the packed forward the CPU batcher runs
        auto p = CpuViT::Create(*m->model.vit);
        if (!p.ok())
          return absl::Status(p.status().code(),
                              absl::StrCat("model ", spec.name, ": ", p.status().message()));
        packed = std::move(*p);
      }
      m->batcher =
          std::make_unique<ClassifyBatcher>(m->model.vit, spec.device, b, on_batch, packed);
    } else {
      const PixelModelConfig& c = m->model.pixel->config();
      m->info.shape = {c.height, c.width_px, c.channels};
      ASSIGN_OR_RETURN(m->info.max_images_per_request,
                       ImagesPerRequest(spec, ModelKind::kGenerator));
      GeneratorOptions g;
      g.engine.max_sequences = spec.max_sequences;
      g.max_waiting = spec.max_waiting;
      g.engine.cuda_graphs = spec.cuda_graphs;
      g.engine.cache_dtype = CacheScalarType(spec.kv_cache_dtype);
      std::function<void(const DecodeEvent&)> on_step;
      if (hooks.on_decode_step)
        on_step = [f = hooks.on_decode_step, name](const DecodeEvent& s) { f(name, s); };
      auto worker = GeneratorWorker::Create(m->model.pixel, g, on_step);
      if (!worker.ok())
        return absl::Status(worker.status().code(),
                            absl::StrCat("model ", spec.name, ": ", worker.status().message()));
      m->generator = std::move(*worker);
    }
    bool& have_default = m->model.classifier() ? default_classifier : default_generator;
    if (spec.is_default && have_default)
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", spec.name, ": a second default ",
          m->model.classifier() ? "classifier" : "generator", " (at most one per kind)"));
    have_default = have_default || spec.is_default;
    Describe(m.get());
    m->info.is_default = spec.is_default;
    reg->models_.push_back(std::move(m));
  }
  // Without an explicit default, the first model of each kind is the default.
  for (ModelKind kind : {ModelKind::kClassifier, ModelKind::kGenerator}) {
    const bool have = kind == ModelKind::kClassifier ? default_classifier : default_generator;
    if (have) continue;
    for (auto& m : reg->models_) {
      if (m->info.kind == kind) {
        m->info.is_default = true;
        break;
      }
    }
  }
  return reg;
}

Registry::~Registry() { Stop(); }

void Registry::Stop() {
  for (auto& m : models_) {
    if (m->batcher) m->batcher->Stop();
    if (m->generator) m->generator->Stop();
  }
}

absl::StatusOr<ServedModel*> Registry::FindAny(const std::string& name) const {
  for (const auto& m : models_)
    if (m->spec.name == name) return m.get();
  std::vector<std::string> names;
  for (const auto& m : models_) names.push_back(m->spec.name);
  return absl::NotFoundError(absl::StrCat(
      "model \"", name, "\" is not served (models: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<ServedModel*> Registry::Find(const std::string& name, ModelKind kind) const {
  const char* kind_name = ModelKindName(kind);
  if (name.empty()) {
    for (const auto& m : models_)
      if (m->info.kind == kind && m->info.is_default) return m.get();
    return absl::NotFoundError(absl::StrCat("model is empty and this server has no ", kind_name));
  }
  auto m = FindAny(name);
  if (!m.ok()) return m.status();
  if ((*m)->info.kind != kind)
    return absl::FailedPreconditionError(absl::StrCat("model \"", name, "\" is not a ", kind_name));
  return *m;
}

}  // namespace krause::server
