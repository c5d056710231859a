#include "server/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/util/status_macros.h"
#include "server/served_classifier.h"
#include "server/served_generator.h"

namespace krause::server {
namespace {

// The kinds a checkpoint can hold: how to tell, and how to serve it. The one table a new kind
// joins.
struct KindEntry {
  ModelKind kind;
  bool (*holds)(const LoadedModel& model);
  absl::StatusOr<std::unique_ptr<ServedModel>> (*serve)(const ModelSpec& spec,
                                                        const LoadedModel& model,
                                                        const WorkerHooks& hooks);
};
constexpr KindEntry kKinds[] = {
    {ModelKind::kClassifier, [](const LoadedModel& m) { return m.vit != nullptr; },
     &ServedClassifier::Create},
    {ModelKind::kGenerator, [](const LoadedModel& m) { return m.pixel != nullptr; },
     &ServedGenerator::Create},
};

absl::StatusOr<std::unique_ptr<ServedModel>> Serve(const ModelSpec& spec,
                                                   const WorkerHooks& hooks) {
  auto loaded = LoadModel(spec.checkpoint, spec.device);
  if (!loaded.ok()) return WithContext("model " + spec.name, loaded.status());
  for (const KindEntry& k : kKinds)
    if (k.holds(*loaded)) return k.serve(spec, *loaded, hooks);
  return absl::InternalError(absl::StrCat("model ", spec.name, ": a checkpoint of no known kind"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Registry>> Registry::Load(const std::vector<ModelSpec>& specs,
                                                         const WorkerHooks& hooks) {
  auto reg = std::make_unique<Registry>();
  for (const ModelSpec& spec : specs) {
    auto m = Serve(spec, hooks);
    if (!m.ok()) return m.status();
    const ModelKind kind = (*m)->kind();
    for (const auto& other : reg->models_) {
      if (spec.is_default && other->kind() == kind && other->info().is_default)
        return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, ": a second default ",
                                                       ModelKindName(kind),
                                                       " (at most one per kind)"));
    }
    reg->models_.push_back(std::move(*m));
  }
  // Without an explicit default, the first model of each kind is the default.
  for (const KindEntry& k : kKinds) {
    ServedModel* first = nullptr;
    bool have = false;
    for (auto& m : reg->models_) {
      if (m->kind() != k.kind) continue;
      if (first == nullptr) first = m.get();
      have = have || m->info().is_default;
    }
    if (!have && first != nullptr) first->set_default(true);
  }
  return reg;
}

Registry::~Registry() { Stop(); }

void Registry::Stop() {
  for (auto& m : models_) m->Stop();
}

absl::StatusOr<ServedModel*> Registry::FindAny(const std::string& name) const {
  for (const auto& m : models_)
    if (m->name() == name) return m.get();
  std::vector<std::string> names;
  for (const auto& m : models_) names.push_back(m->name());
  return absl::NotFoundError(absl::StrCat(
      "model \"", name, "\" is not served (models: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<ServedModel*> Registry::Find(const std::string& name, ModelKind kind) const {
  const char* kind_name = ModelKindName(kind);
  if (name.empty()) {
    for (const auto& m : models_)
      if (m->kind() == kind && m->info().is_default) return m.get();
    return absl::NotFoundError(absl::StrCat("model is empty and this server has no ", kind_name));
  }
  auto m = FindAny(name);
  if (!m.ok()) return m.status();
  if ((*m)->kind() != kind)
    return absl::FailedPreconditionError(absl::StrCat("model \"", name, "\" is not a ", kind_name));
  return *m;
}

}  // namespace krause::server
