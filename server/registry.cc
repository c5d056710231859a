#include "server/registry.h"

#include <algorithm>
#include <map>

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
                                                         const WorkerHooks& hooks,
                                                         std::vector<std::string>* failures) {
  auto reg = std::make_unique<Registry>();
  for (const ModelSpec& spec : specs) {
    auto m = Serve(spec, hooks);
    if (!m.ok() && failures != nullptr) {
      failures->push_back(absl::StrCat("version ", spec.version, " (", spec.checkpoint,
                                       "): ", m.status().message()));
      continue;
    }
    if (!m.ok()) return m.status();
    const ModelKind kind = (*m)->kind();
    for (const auto& other : reg->models_) {
      if (other->name() == spec.name && other->info().version == spec.version)
        return absl::InvalidArgumentError(
            absl::StrCat("model ", spec.name, ": version ", spec.version, " twice"));
      if (other->name() == spec.name && other->kind() != kind)
        return absl::InvalidArgumentError(absl::StrCat(
            "model ", spec.name, " version ", spec.version, " is a ", ModelKindName(kind),
            " but version ", other->info().version, " is a ", ModelKindName(other->kind())));
      if (spec.is_default && other->kind() == kind && other->info().is_default &&
          other->name() != spec.name)
        return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, ": a second default ",
                                                       ModelKindName(kind),
                                                       " (at most one per kind)"));
    }
    reg->models_.push_back(std::move(*m));
  }
  if (reg->models_.empty()) return absl::NotFoundError("no model could be loaded");
  // Without an explicit default, the first model of each kind is the default (every version of
  // it).
  for (const KindEntry& k : kKinds) {
    const ServedModel* first = nullptr;
    bool have = false;
    for (auto& m : reg->models_) {
      if (m->kind() != k.kind) continue;
      if (first == nullptr) first = m.get();
      have = have || m->info().is_default;
    }
    if (have || first == nullptr) continue;
    const std::string name = first->name();
    for (auto& m : reg->models_)
      if (m->name() == name) m->set_default(true);
  }
  // Each name's versions together, ascending, the names in the order they first came.
  std::map<std::string, size_t> first_seen;
  for (const auto& m : reg->models_) first_seen.emplace(m->name(), first_seen.size());
  std::stable_sort(reg->models_.begin(), reg->models_.end(), [&](const auto& a, const auto& b) {
    const size_t x = first_seen.at(a->name()), y = first_seen.at(b->name());
    return x != y ? x < y : a->info().version < b->info().version;
  });
  return reg;
}

Registry::~Registry() { Stop(); }

void Registry::Stop() {
  for (auto& m : models_) m->Stop();
}

std::vector<int64_t> Registry::Versions(const std::string& name) const {
  std::vector<int64_t> out;
  for (const auto& m : models_)
    if (m->name() == name) out.push_back(m->info().version);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<ServedModel*> Registry::FindAny(const std::string& name,
                                               const std::string& version) const {
  ServedModel* newest = nullptr;
  for (const auto& m : models_) {
    if (m->name() != name) continue;
    if (!version.empty() && std::to_string(m->info().version) == version) return m.get();
    if (newest == nullptr || m->info().version > newest->info().version) newest = m.get();
  }
  if (newest != nullptr && version.empty()) return newest;
  if (newest != nullptr)
    return absl::NotFoundError(
        absl::StrCat("model ", name, " has no version \"", version.substr(0, 64),
                     "\" (versions served: ", absl::StrJoin(Versions(name), ", "), ")"));
  std::vector<std::string> names;
  for (const auto& m : models_)
    if (names.empty() || names.back() != m->name()) names.push_back(m->name());
  return absl::NotFoundError(absl::StrCat(
      "model \"", name, "\" is not served (models: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<ServedModel*> Registry::Find(const std::string& name, ModelKind kind,
                                            const std::string& version) const {
  const char* kind_name = ModelKindName(kind);
  if (name.empty()) {
    for (const auto& m : models_)
      if (m->kind() == kind && m->info().is_default) return FindAny(m->name(), version);
    return absl::NotFoundError(absl::StrCat("model is empty and this server has no ", kind_name));
  }
  auto m = FindAny(name, version);
  if (!m.ok()) return m.status();
  if ((*m)->kind() != kind)
    return absl::FailedPreconditionError(absl::StrCat("model \"", name, "\" is not a ", kind_name));
  return *m;
}

}  // namespace krause::server
