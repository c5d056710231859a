#include "server/core/registry.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/engine/kernel_check.h"
#include "model/util/status_macros.h"
#include "server/core/errors.h"
#include "server/core/served_classifier.h"
#include "server/core/served_generator.h"

namespace krause::server {
namespace {

// The dtype LoadModel rounds a model's linear weights to.
at::ScalarType WeightsScalarType(WeightsDtype dtype) {
  return dtype == WeightsDtype::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

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

KernelCheckRecord Record(const KernelCheck& c) {
  KernelCheckRecord r;
  r.implementation = KrauseImplName(c.choice.impl);
  r.device = c.choice.device;
  r.result = CheckOutcomeName(c.outcome);
  r.max_abs_diff = c.max_abs_diff;
  r.tolerance = c.tolerance;
  r.detail = c.where;
  r.seconds = c.seconds;
  r.summary = c.Summary();
  return r;
}

}  // namespace

absl::StatusOr<Registry::Checked> Registry::Check(const ModelSpec& spec,
                                                  const LoadedModel& loaded) {
  auto forced = ParseServingImpl(spec.attention_impl);
  if (!forced.ok()) return WithContext("model " + spec.name, forced.status());
  auto chain = ServingChain(spec.device, *forced);
  if (!chain.ok()) return WithContext("model " + spec.name, chain.status());
  Checked out;
  if (spec.kernel_check == KernelCheckMode::kOff) {
    KernelCheck unchecked;
    unchecked.choice = chain->front();
    out.choice = chain->front();
    out.checks.push_back(Record(unchecked));
    return out;
  }
  // The reference runs on the CPU: the same weights loaded there when the model is not.
  std::optional<LoadedModel> cpu;
  const auto on = [&](const std::string& device) -> absl::StatusOr<const LoadedModel*> {
    if (device == spec.device) return &loaded;
    if (!cpu) {
      auto l = LoadModel(spec.checkpoint, "cpu", WeightsScalarType(spec.weights_dtype));
      if (!l.ok()) return l.status();
      cpu = std::move(*l);
    }
    return &*cpu;
  };
  auto reference = on("cpu");
  if (!reference.ok()) return WithContext("model " + spec.name, reference.status());
  std::vector<std::string> failed;
  for (const ServingChoice& choice : *chain) {
    auto model = on(choice.device);
    if (!model.ok()) return WithContext("model " + spec.name, model.status());
    const KernelCheck c = CheckLoadedModel(**model, **reference, choice,
                                           CacheScalarType(spec.kv_cache_dtype), spec.precision);
    out.checks.push_back(Record(c));
    if (c.passed()) {
      out.choice = choice;
      if (choice.device != spec.device) out.moved = std::move(*cpu);
      return out;
    }
    failed.push_back(c.Summary());
    if (spec.kernel_check == KernelCheckMode::kStrict) break;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("model ", spec.name,
                   ": the kernel check (--kernel_check=", KernelCheckModeName(spec.kernel_check),
                   ") passed no implementation: ", absl::StrJoin(failed, "; ")));
}

absl::StatusOr<ModelRef> Registry::Build(const ModelSpec& spec, const WorkerHooks& hooks) {
  auto loaded = LoadModel(spec.checkpoint, spec.device, WeightsScalarType(spec.weights_dtype));
  if (!loaded.ok()) return WithContext("model " + spec.name, loaded.status());
  auto checked = Check(spec, *loaded);
  if (!checked.ok()) return checked.status();
  // Served as checked: on the implementation (and device) that passed.
  ModelSpec serve = spec;
  serve.device = checked->choice.device;
  serve.attention_impl = KrauseImplName(checked->choice.impl);
  if (serve.device != spec.device) {  // the CPU fallback of a GPU model
    // As checked there (CpuCacheDtype): bf16 rings stay bf16, fp16 ones become fp32.
    if (serve.kv_cache_dtype == KvCacheDtype::kFloat16)
      serve.kv_cache_dtype = KvCacheDtype::kFloat32;
    serve.cuda_graphs = false;
  }
  const LoadedModel& model = checked->moved ? *checked->moved : *loaded;
  for (const KindEntry& k : kKinds) {
    if (!k.holds(model)) continue;
    auto served = k.serve(serve, model, hooks);
    if (!served.ok()) return served.status();
    (*served)->set_kernel_checks(serve.attention_impl, std::move(checked->checks));
    return ModelRef(std::move(*served));
  }
  return absl::InternalError(absl::StrCat("model ", spec.name, ": a checkpoint of no known kind"));
}

absl::Status Registry::CheckAgainst(const Table& table, const ServedModel& model) const {
  for (const auto& other : table) {
    if (other->name() == model.name() && other->kind() != model.kind())
      return absl::InvalidArgumentError(
          absl::StrCat("model ", model.name(), " version ", model.info().version, " is a ",
                       ModelKindName(model.kind()), " but version ", other->info().version,
                       " is a ", ModelKindName(other->kind())));
    if (model.spec().is_default && other->kind() == model.kind() && other->info().is_default &&
        other->name() != model.name())
      return absl::InvalidArgumentError(absl::StrCat("model ", model.name(), ": a second default ",
                                                     ModelKindName(model.kind()),
                                                     " (at most one per kind)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Registry>> Registry::Load(const std::vector<ModelSpec>& specs,
                                                         const WorkerHooks& hooks,
                                                         std::vector<std::string>* failures,
                                                         bool allow_empty) {
  auto reg = std::make_unique<Registry>();
  Table models;
  for (const ModelSpec& spec : specs) {
    auto m = Build(spec, hooks);
    if (!m.ok() && failures != nullptr) {
      failures->push_back(absl::StrCat("version ", spec.version, " (", spec.checkpoint,
                                       "): ", m.status().message()));
      continue;
    }
    if (!m.ok()) return m.status();
    for (const auto& other : models)
      if (other->name() == spec.name && other->info().version == spec.version)
        return absl::InvalidArgumentError(
            absl::StrCat("model ", spec.name, ": version ", spec.version, " twice"));
    if (absl::Status st = reg->CheckAgainst(models, **m); !st.ok()) return st;
    models.push_back(std::move(*m));
  }
  if (models.empty() && !allow_empty) return absl::NotFoundError("no model could be loaded");
  // Without an explicit default, the first model of each kind is the default (every version of
  // it).
  for (const KindEntry& k : kKinds) {
    const ServedModel* first = nullptr;
    bool have = false;
    for (auto& m : models) {
      if (m->kind() != k.kind) continue;
      if (first == nullptr) first = m.get();
      have = have || m->info().is_default;
    }
    if (have || first == nullptr) continue;
    const std::string name = first->name();
    for (auto& m : models)
      if (m->name() == name) m->set_default(true);
  }
  // Each name's versions together, ascending, the names in the order they first came.
  std::map<std::string, size_t> first_seen;
  for (const auto& m : models) first_seen.emplace(m->name(), first_seen.size());
  std::stable_sort(models.begin(), models.end(), [&](const auto& a, const auto& b) {
    const size_t x = first_seen.at(a->name()), y = first_seen.at(b->name());
    return x != y ? x < y : a->info().version < b->info().version;
  });
  reg->table_ = std::make_shared<const Table>(std::move(models));
  return reg;
}

Registry::~Registry() { Stop(); }

void Registry::Stop() {
  std::shared_ptr<const Table> t;
  std::vector<ModelRef> retiring;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = table_;
    retiring = retiring_;
  }
  for (const auto& m : *t) m->Stop();
  for (const auto& m : retiring) m->Stop();
}

std::shared_ptr<const Registry::Table> Registry::table() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

std::vector<ModelRef> Registry::models() const { return *table(); }

std::vector<ModelRef> Registry::retiring() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retiring_;
}

std::vector<Registry::Freed> Registry::freed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return freed_;
}

absl::Status Registry::Install(ModelRef model) {
  std::lock_guard<std::mutex> lock(mu_);
  const Table& old = *table_;
  Table next, replaced;
  next.reserve(old.size() + 1);
  for (const auto& m : old)
    (m->name() == model->name() && m->info().version == model->info().version ? replaced : next)
        .push_back(m);
  if (absl::Status st = CheckAgainst(next, *model); !st.ok()) return st;
  retiring_.insert(retiring_.end(), replaced.begin(), replaced.end());
  // A default name stays the default in each version; a kind without a default gets this one.
  bool name_default = model->spec().is_default, kind_default = false;
  for (const auto& m : old) {
    if (m->name() == model->name()) name_default = name_default || m->info().is_default;
    if (m->kind() == model->kind()) kind_default = kind_default || m->info().is_default;
  }
  model->set_default(name_default || !kind_default);
  // Its place: after the name's lower versions (a new name goes last).
  auto pos = next.end();
  for (auto it = next.begin(); it != next.end(); ++it) {
    if ((*it)->name() != model->name()) continue;
    pos = it + 1;
    if ((*it)->info().version > model->info().version) {
      pos = it;
      break;
    }
  }
  const std::string name = model->name();
  const int64_t version = model->info().version;
  next.insert(pos, std::move(model));
  removed_names_.erase(name);
  freed_.erase(
      std::remove_if(freed_.begin(), freed_.end(),
                     [&](const Freed& f) { return f.name == name && f.version == version; }),
      freed_.end());
  table_ = std::make_shared<const Table>(std::move(next));
  return absl::OkStatus();
}

absl::Status Registry::Remove(const std::string& name, int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  Table next;
  bool removed = false, left = false;
  for (const auto& m : *table_) {
    if (m->name() == name && (version == 0 || m->info().version == version)) {
      retiring_.push_back(m);
      removed = true;
      continue;
    }
    left = left || m->name() == name;
    next.push_back(m);
  }
  if (!removed)
    return absl::NotFoundError(
        version == 0 ? absl::StrCat("model ", name, " is not served")
                     : absl::StrCat("model ", name, " version ", version, " is not served"));
  if (!left) removed_names_.insert(name);
  table_ = std::make_shared<const Table>(std::move(next));
  return absl::OkStatus();
}

size_t Registry::Collect() {
  std::vector<ModelRef> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Only the retiring list refers to it: no call holds it, and none can find it any more.
    auto unused = std::stable_partition(retiring_.begin(), retiring_.end(),
                                        [](const ModelRef& m) { return m.use_count() > 1; });
    done.assign(std::make_move_iterator(unused), std::make_move_iterator(retiring_.end()));
    retiring_.erase(unused, retiring_.end());
  }
  for (ModelRef& m : done) {
    m->Stop();
    Freed f{m->name(), m->info().version, m->kind()};
    m.reset();  // frees the weights and caches here
    std::lock_guard<std::mutex> lock(mu_);
    const bool served = std::any_of(table_->begin(), table_->end(), [&](const ModelRef& s) {
      return s->name() == f.name && s->info().version == f.version;
    });
    if (served) continue;  // replaced by a new copy of the same version: its gauges are live
    freed_.erase(
        std::remove_if(freed_.begin(), freed_.end(),
                       [&](const Freed& x) { return x.name == f.name && x.version == f.version; }),
        freed_.end());
    freed_.push_back(std::move(f));
    if (freed_.size() > 64) freed_.erase(freed_.begin());
  }
  std::lock_guard<std::mutex> lock(mu_);
  return retiring_.size();
}

std::vector<int64_t> Registry::Versions(const std::string& name) const {
  std::vector<int64_t> out;
  for (const auto& m : *table())
    if (m->name() == name) out.push_back(m->info().version);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<ModelRef> Registry::FindAny(const std::string& name,
                                           const std::string& version) const {
  const std::shared_ptr<const Table> t = table();
  const ModelRef* newest = nullptr;
  for (const auto& m : *t) {
    if (m->name() != name) continue;
    if (!version.empty() && std::to_string(m->info().version) == version) return m;
    if (newest == nullptr || m->info().version > (*newest)->info().version) newest = &m;
  }
  if (newest != nullptr && version.empty()) return *newest;
  if (newest != nullptr)
    return absl::NotFoundError(
        absl::StrCat("model ", name, " has no version \"", version.substr(0, 64),
                     "\" (versions served: ", absl::StrJoin(Versions(name), ", "), ")"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (removed_names_.count(name) > 0)
      return Refusal(absl::StrCat("model ", name, " is unloaded: no version of it is served now"),
                     reason::kModelUnloaded, name);
  }
  std::vector<std::string> names;
  for (const auto& m : *t)
    if (names.empty() || names.back() != m->name()) names.push_back(m->name());
  return absl::NotFoundError(absl::StrCat(
      "model \"", name, "\" is not served (models: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<ModelRef> Registry::Find(const std::string& name, ModelKind kind,
                                        const std::string& version) const {
  const char* kind_name = ModelKindName(kind);
  if (name.empty()) {
    for (const auto& m : *table())
      if (m->kind() == kind && m->info().is_default) return FindAny(m->name(), version);
    return absl::NotFoundError(absl::StrCat("model is empty and this server has no ", kind_name));
  }
  auto m = FindAny(name, version);
  if (!m.ok()) return m.status();
  if ((*m)->kind() != kind)
    return absl::FailedPreconditionError(absl::StrCat("model \"", name, "\" is not a ", kind_name));
  return m;
}

}  // namespace krause::server
