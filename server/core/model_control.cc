#include "server/core/model_control.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/errors.h"

namespace krause::server {
namespace {

// A request's version: empty (0) or a positive integer's decimal text.
absl::StatusOr<int64_t> ParseRequestVersion(const std::string& text) {
  if (text.empty()) return 0;
  int64_t v = 0;
  if (!ParseVersion(text, &v))
    return InvalidField("version", absl::StrCat("version: \"", text.substr(0, 32),
                                                "\" is not a version (a positive integer)"));
  return v;
}

}  // namespace

absl::StatusOr<ModelControlMode> ParseModelControlMode(absl::string_view text) {
  if (text == "none") return ModelControlMode::kNone;
  if (text == "poll") return ModelControlMode::kPoll;
  if (text == "explicit") return ModelControlMode::kExplicit;
  return absl::InvalidArgumentError(
      absl::StrCat("--model_control: \"", text, "\" is not none, poll or explicit"));
}

const char* ModelControlModeName(ModelControlMode mode) {
  switch (mode) {
    case ModelControlMode::kNone:
      return "none";
    case ModelControlMode::kPoll:
      return "poll";
    case ModelControlMode::kExplicit:
      return "explicit";
  }
  return "?";
}

std::vector<IndexEntry> IndexOf(const ModelControl* control, const Registry& registry,
                                bool ready_only) {
  if (control != nullptr) return control->Index(ready_only);
  std::vector<IndexEntry> out;
  for (const ModelRef& m : registry.models())
    out.push_back({m->name(), m->info().version, VersionState::kReady, ""});
  return out;
}

absl::Status NoModelControl(absl::string_view rpc) {
  return absl::FailedPreconditionError(absl::StrCat(
      rpc,
      " needs a versioned repository in --models_dir and --model_control explicit (this "
      "server's models are fixed at start-up)"));
}

const char* VersionStateName(VersionState state) {
  switch (state) {
    case VersionState::kLoading:
      return "LOADING";
    case VersionState::kReady:
      return "READY";
    case VersionState::kUnloading:
      return "UNLOADING";
    case VersionState::kUnavailable:
      return "UNAVAILABLE";
    case VersionState::kFailed:
      return "FAILED";
  }
  return "?";
}

ModelControl::ModelControl(ModelControlOptions options, Registry* registry)
    : options_(std::move(options)), registry_(registry) {}

absl::StatusOr<std::unique_ptr<ModelControl>> ModelControl::Start(ModelControlOptions options,
                                                                  Registry* registry) {
  if (!(options.poll_seconds >= 0.01 && options.poll_seconds <= 86400))
    return absl::InvalidArgumentError(absl::StrCat(
        "--repository_poll_s must be in [0.01, 86400] seconds, got ", options.poll_seconds));
  const std::vector<std::string>& named = options.load_at_start;
  if (!named.empty() && options.mode != ModelControlMode::kExplicit)
    return absl::InvalidArgumentError(
        absl::StrCat("--load_model needs --model_control explicit (mode ",
                     ModelControlModeName(options.mode), " loads every model of the repository)"));
  std::unique_ptr<ModelControl> c(new ModelControl(std::move(options), registry));
  auto scan = ScanRepository(c->options_.repository, c->options_.defaults);
  if (!scan.ok()) return scan.status();
  const std::vector<std::string>& load = c->options_.load_at_start;
  const bool all = c->options_.mode != ModelControlMode::kExplicit ||
                   std::find(load.begin(), load.end(), "*") != load.end();
  if (all) {
    const absl::Status st = c->Apply("", 0, false);
    if (!st.ok()) c->Log(absl::StrCat("not served: ", st.message()));
  } else {
    for (const std::string& name : load) {
      if (std::none_of(scan->begin(), scan->end(),
                       [&](const RepositoryModel& m) { return m.name == name; }))
        return absl::NotFoundError(absl::StrCat(
            "--load_model ", name, ": no such model in the repository ", c->options_.repository));
      const absl::Status st = c->Apply(name, 0, false);
      if (!st.ok()) c->Log(absl::StrCat("not served: ", st.message()));
    }
  }
  if (registry->models().empty() && c->options_.mode == ModelControlMode::kNone)
    return absl::NotFoundError(absl::StrCat("no model of the repository ", c->options_.repository,
                                            " could be loaded (--model_control none)"));
  c->thread_ = std::thread([p = c.get()] { p->Loop(); });
  return c;
}

ModelControl::~ModelControl() { Stop(); }

void ModelControl::Stop() {
  std::deque<std::function<void()>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    left.swap(ops_);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Ops never run: each is told so by running with stop_ set (they check it).
  for (auto& op : left) op();
}

void ModelControl::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void ModelControl::Post(std::function<void()> op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      ops_.push_back(std::move(op));
      op = nullptr;
    }
  }
  if (op) op();  // stopped: it runs at once and sees stop_
  wake_.notify_all();
}

void ModelControl::Loop() {
  using Clock = std::chrono::steady_clock;
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.poll_seconds));
  Clock::time_point next_poll = Clock::now() + period;
  size_t retiring = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // Retired versions are freed within 0.1 s of their last call.
    Clock::time_point until = Clock::time_point::max();
    if (options_.mode == ModelControlMode::kPoll) until = next_poll;
    if (retiring > 0) until = std::min(until, Clock::now() + std::chrono::milliseconds(100));
    wake_.wait_until(lock, until, [&] { return stop_ || !ops_.empty(); });
    if (stop_) break;
    while (!ops_.empty()) {
      std::function<void()> op = std::move(ops_.front());
      ops_.pop_front();
      lock.unlock();
      op();
      lock.lock();
    }
    lock.unlock();
    if (options_.mode == ModelControlMode::kPoll && Clock::now() >= next_poll) {
      const absl::Status st = Apply("", 0, false);
      if (!st.ok()) Log(absl::StrCat("poll: ", st.message()));
      next_poll = Clock::now() + period;
    }
    retiring = registry_->Collect();
    lock.lock();
  }
}

absl::Status ModelControl::LoadVersion(const VersionLoad& load) {
  const VersionKey key{load.spec.name, load.spec.version};
  {
    std::lock_guard<std::mutex> lock(mu_);
    loading_.insert(key);
  }
  Log(absl::StrCat("loading model ", key.name, " version ", key.version, " (", load.spec.checkpoint,
                   ")"));
  absl::Status st;
  auto model = Registry::Build(load.spec, options_.hooks);
  if (!model.ok()) st = model.status();
  if (st.ok()) st = (*model)->WarmUp();
  if (st.ok()) st = registry_->Install(*model);
  if (!st.ok() && model.ok()) (*model)->Stop();  // never served: no call holds it
  std::lock_guard<std::mutex> lock(mu_);
  loading_.erase(key);
  failed_.erase(std::remove_if(failed_.begin(), failed_.end(),
                               [&](const FailedVersion& f) { return f.key == key; }),
                failed_.end());
  if (!st.ok()) {
    failed_.push_back({key, load.fingerprint, std::string(st.message())});
    Log(absl::StrCat("model ", key.name, " version ", key.version, " FAILED: ", st.message()));
    return absl::FailedPreconditionError(absl::StrCat("model ", key.name, " version ", key.version,
                                                      " failed to load: ", st.message()));
  }
  fingerprints_[key] = load.fingerprint;
  unloaded_.erase(key);
  Log(KernelCheckLine((*model)->info()));
  Log(absl::StrCat("model ", key.name, " version ", key.version, " READY"));
  return absl::OkStatus();
}

absl::Status ModelControl::Apply(const std::string& only, int64_t version, bool retry_failed) {
  auto scan = ScanRepository(options_.repository, options_.defaults);
  if (!scan.ok()) return scan.status();
  if (!only.empty()) {
    const auto m = std::find_if(scan->begin(), scan->end(),
                                [&](const RepositoryModel& r) { return r.name == only; });
    if (m == scan->end())
      return absl::NotFoundError(
          absl::StrCat("model ", only, " is not in the repository ", options_.repository));
    if (!m->problem.empty())
      return absl::FailedPreconditionError(absl::StrCat("model ", only, ": ", m->problem));
    if (version == 0 && PolicyVersions(*m).empty()) {
      std::vector<std::string> problems;
      for (const RepositoryVersion& v : m->versions)
        if (!v.problem.empty()) problems.push_back(v.problem);
      return absl::FailedPreconditionError(absl::StrCat(
          "model ", only, " has no version its version_policy can load",
          problems.empty() ? "" : absl::StrCat(" (", absl::StrJoin(problems, "; "), ")")));
    }
    if (version != 0) {
      const auto v = std::find_if(m->versions.begin(), m->versions.end(),
                                  [&](const RepositoryVersion& r) { return r.version == version; });
      if (v == m->versions.end())
        return absl::NotFoundError(
            absl::StrCat("model ", only, " has no version ", version, " in the repository"));
      if (!v->problem.empty())
        return absl::FailedPreconditionError(
            absl::StrCat("model ", only, " version ", version, ": ", v->problem));
    }
  }
  std::vector<std::string> failures;
  // Loads first; a load that fails changes the plan (the policy falls back to the versions that
  // do load), so the plan is made again before anything is unloaded.
  for (int round = 0; round < 3; ++round) {
    std::vector<ServedVersion> served;
    std::vector<FailedVersion> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const ModelRef& m : registry_->models()) {
        const VersionKey key{m->name(), m->info().version};
        const auto fp = fingerprints_.find(key);
        served.push_back({key, fp == fingerprints_.end() ? "" : fp->second});
      }
      for (const FailedVersion& f : failed_)
        if (!(retry_failed && round == 0 && f.key.name == only)) failed.push_back(f);
    }
    const RepositoryPlan plan = PlanRepository(*scan, served, failed, only, version);
    bool all_loaded = true;
    for (const VersionLoad& load : plan.load) {
      const absl::Status st = LoadVersion(load);
      if (!st.ok()) {
        failures.emplace_back(st.message());
        all_loaded = false;
      }
    }
    if (!all_loaded && version == 0) continue;
    for (const VersionKey& key : plan.unload) {
      if (!registry_->Remove(key.name, key.version).ok()) continue;
      std::lock_guard<std::mutex> lock(mu_);
      fingerprints_.erase(key);
      unloaded_[key] = "not in the version policy any more";
      Log(absl::StrCat("model ", key.name, " version ", key.version, " unloaded (", unloaded_[key],
                       ")"));
    }
    break;
  }
  if (failures.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrJoin(failures, "; "));
}

void ModelControl::Load(const std::string& name, const std::string& version_text, Done done) {
  if (options_.mode != ModelControlMode::kExplicit)
    return done(absl::FailedPreconditionError(
        absl::StrCat("LoadModel needs --model_control explicit (this server runs ",
                     ModelControlModeName(options_.mode),
                     options_.mode == ModelControlMode::kPoll
                         ? ": the repository decides; add or remove version folders)"
                         : ")")));
  if (name.empty()) return done(InvalidField("name", "name is required"));
  auto version = ParseRequestVersion(version_text);
  if (!version.ok()) return done(version.status());
  Post([this, name, v = *version, done = std::move(done)] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return done(Refusal("the server is shutting down", reason::kDraining));
    }
    const absl::Status st = Apply(name, v, true);
    if (!st.ok()) return done(st);
    done(EntriesOf(name));
  });
}

void ModelControl::Unload(const std::string& name, const std::string& version_text, Done done) {
  if (options_.mode != ModelControlMode::kExplicit)
    return done(absl::FailedPreconditionError(
        absl::StrCat("UnloadModel needs --model_control explicit (this server runs ",
                     ModelControlModeName(options_.mode), ")")));
  if (name.empty()) return done(InvalidField("name", "name is required"));
  auto version = ParseRequestVersion(version_text);
  if (!version.ok()) return done(version.status());
  Post([this, name, v = *version, done = std::move(done)] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return done(Refusal("the server is shutting down", reason::kDraining));
    }
    std::vector<int64_t> versions = registry_->Versions(name);
    if (v != 0) versions.assign(1, v);
    const absl::Status st = registry_->Remove(name, v);
    if (!st.ok()) return done(st);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int64_t x : versions) {
        fingerprints_.erase({name, x});
        unloaded_[{name, x}] = "unloaded (UnloadModel)";
      }
    }
    Log(absl::StrCat("model ", name, v == 0 ? "" : absl::StrCat(" version ", v),
                     " unloaded (UnloadModel)"));
    done(EntriesOf(name));
  });
}

void ModelControl::PollNow() {
  std::promise<void> done;
  Post([&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return done.set_value();  // shutting down: nothing loads any more
    }
    const absl::Status st = Apply("", 0, false);
    if (!st.ok()) Log(absl::StrCat("poll: ", st.message()));
    done.set_value();
  });
  done.get_future().wait();
}

std::vector<IndexEntry> ModelControl::EntriesOf(const std::string& name) const {
  std::vector<IndexEntry> out;
  for (IndexEntry& e : Index())
    if (e.name == name) out.push_back(std::move(e));
  return out;
}

std::vector<IndexEntry> ModelControl::Index(bool ready_only) const {
  auto scan = ScanRepository(options_.repository, options_.defaults);
  std::map<VersionKey, IndexEntry> out;
  const auto put = [&](const VersionKey& k, VersionState s, std::string reason) {
    out[k] = IndexEntry{k.name, k.version, s, std::move(reason)};
  };
  std::set<VersionKey> served, retiring;
  for (const ModelRef& m : registry_->models()) served.insert({m->name(), m->info().version});
  for (const ModelRef& m : registry_->retiring()) retiring.insert({m->name(), m->info().version});
  std::lock_guard<std::mutex> lock(mu_);
  if (scan.ok()) {
    for (const RepositoryModel& m : *scan) {
      if (!m.problem.empty()) put({m.name, 0}, VersionState::kFailed, m.problem);
      const std::vector<int64_t> policy = PolicyVersions(m);
      for (const RepositoryVersion& v : m.versions) {
        const VersionKey k{m.name, v.version};
        std::string reason = v.problem;
        if (reason.empty() && std::find(policy.begin(), policy.end(), v.version) == policy.end())
          reason = "not in the version policy";
        if (const auto u = unloaded_.find(k); u != unloaded_.end()) reason = u->second;
        if (reason.empty()) reason = "not loaded";
        VersionState state = VersionState::kUnavailable;
        for (const FailedVersion& f : failed_)
          if (f.key == k && f.fingerprint == VersionFingerprint(m, v)) {
            state = VersionState::kFailed;
            reason = f.reason;
          }
        put(k, state, reason);
      }
    }
  }
  for (const VersionKey& k : retiring)
    if (served.count(k) == 0) put(k, VersionState::kUnloading, "");
  for (const VersionKey& k : served) put(k, VersionState::kReady, "");
  for (const VersionKey& k : loading_) put(k, VersionState::kLoading, "");
  std::vector<IndexEntry> list;
  for (auto& [k, e] : out)
    if (!ready_only || e.state == VersionState::kReady) list.push_back(std::move(e));
  return list;
}

}  // namespace krause::server
