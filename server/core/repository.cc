#include "server/core/repository.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "model/util/files.h"

namespace krause::server {
namespace {

namespace fs = std::filesystem;

constexpr char kCheckpointFile[] = "model.safetensors";
constexpr char kConfigFile[] = "config.json";
constexpr int64_t kMaxVersion = int64_t{1} << 53;

std::string Fingerprint(const fs::path& file) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) return "";
  const auto mtime = fs::last_write_time(file, ec);
  if (ec) return "";
  return absl::StrCat(size, "@", mtime.time_since_epoch().count());
}

}  // namespace

bool ParseVersion(const std::string& name, int64_t* out) {
  if (name.empty() || name.size() > 16 || name[0] == '0') return false;
  if (!std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  return absl::SimpleAtoi(name, out) && *out >= 1 && *out <= kMaxVersion;
}

bool IsVersionedRepository(const std::string& dir) {
  std::error_code ec;
  bool folders = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") return false;
    folders = folders || e.is_directory(ec);
  }
  return !ec && folders;
}

absl::Status ParseModelConfig(const std::string& json, const std::string& where, ModelSpec* options,
                              VersionPolicy* policy) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  ModelSpec o = *options;
  if (absl::Status st = ReadServingOptions(j, where, {"version_policy"}, &o); !st.ok()) return st;
  VersionPolicy p;
  if (const auto it = j.find("version_policy"); it != j.end()) {
    const std::string w = where + ".version_policy";
    const nlohmann::json& v = *it;
    if (!v.is_object() || v.size() != 1 || (!v.contains("latest") && !v.contains("specific")))
      return absl::InvalidArgumentError(absl::StrCat(
          w, " must be {\"latest\": N} or {\"specific\": [versions]}, got ", v.dump()));
    if (v.contains("latest")) {
      const nlohmann::json& n = v["latest"];
      if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > 64)
        return absl::InvalidArgumentError(
            absl::StrCat(w, ".latest must be an integer in [1, 64], got ", n.dump()));
      p.latest = n.get<int64_t>();
    } else {
      const nlohmann::json& list = v["specific"];
      if (!list.is_array() || list.empty() || list.size() > 64)
        return absl::InvalidArgumentError(
            absl::StrCat(w, ".specific must be a list of 1 to 64 versions, got ", list.dump()));
      for (const nlohmann::json& x : list) {
        if (!x.is_number_integer() || x.get<int64_t>() < 1 || x.get<int64_t>() > kMaxVersion)
          return absl::InvalidArgumentError(
              absl::StrCat(w, ".specific must hold positive integer versions, got ", x.dump()));
        p.specific.push_back(x.get<int64_t>());
      }
      std::sort(p.specific.begin(), p.specific.end());
      p.specific.erase(std::unique(p.specific.begin(), p.specific.end()), p.specific.end());
    }
  }
  *options = std::move(o);
  *policy = std::move(p);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RepositoryModel>> ScanRepository(const std::string& dir,
                                                            const ModelSpec& defaults) {
  std::error_code ec;
  std::vector<fs::path> folders;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory()) folders.push_back(e.path());
  if (ec) return absl::NotFoundError(absl::StrCat("model repository ", dir, ": ", ec.message()));
  std::sort(folders.begin(), folders.end());
  std::vector<RepositoryModel> out;
  for (const fs::path& folder : folders) {
    RepositoryModel m;
    m.options = defaults;
    m.name = folder.filename().string();
    if (!ValidModelName(m.name)) {
      m.problem =
          absl::StrCat(folder.string(), ": not a model name (it must match [A-Za-z0-9._-]{1,64})");
      out.push_back(std::move(m));
      continue;
    }
    const fs::path config = folder / kConfigFile;
    if (fs::exists(config, ec)) {
      m.config_fingerprint = Fingerprint(config);
      auto text = ReadFileToString(config.string());
      absl::Status st = text.ok() ? ParseModelConfig(*text, config.string(), &m.options, &m.policy)
                                  : text.status();
      if (!st.ok()) m.problem = std::string(st.message());
    }
    std::error_code vec;
    for (const auto& e : fs::directory_iterator(folder, vec)) {
      if (!e.is_directory()) continue;
      const std::string name = e.path().filename().string();
      RepositoryVersion v;
      if (!ParseVersion(name, &v.version)) {
        m.ignored.push_back(absl::StrCat(e.path().string(),
                                         ": not a version (a positive integer, no leading zero)"));
        continue;
      }
      const fs::path ckpt = e.path() / kCheckpointFile;
      v.checkpoint = ckpt.string();
      v.fingerprint = Fingerprint(ckpt);
      if (v.fingerprint.empty()) v.problem = absl::StrCat(ckpt.string(), ": missing");
      m.versions.push_back(std::move(v));
    }
    if (vec) m.problem = absl::StrCat(folder.string(), ": ", vec.message());
    std::sort(m.versions.begin(), m.versions.end(),
              [](const RepositoryVersion& a, const RepositoryVersion& b) {
                return a.version < b.version;
              });
    std::sort(m.ignored.begin(), m.ignored.end());
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<int64_t> PolicyVersions(const RepositoryModel& m) {
  std::vector<int64_t> loadable;
  if (!m.problem.empty()) return loadable;
  for (const RepositoryVersion& v : m.versions)
    if (v.problem.empty()) loadable.push_back(v.version);
  if (!m.policy.specific.empty()) {
    std::vector<int64_t> out;
    for (int64_t v : m.policy.specific)
      if (std::binary_search(loadable.begin(), loadable.end(), v)) out.push_back(v);
    return out;
  }
  const size_t keep = std::min<size_t>(loadable.size(), static_cast<size_t>(m.policy.latest));
  return std::vector<int64_t>(loadable.end() - static_cast<std::ptrdiff_t>(keep), loadable.end());
}

ModelSpec SpecFor(const RepositoryModel& m, const RepositoryVersion& v) {
  ModelSpec s = m.options;
  s.name = m.name;
  s.checkpoint = v.checkpoint;
  s.version = v.version;
  return s;
}

absl::StatusOr<std::vector<ModelSpec>> RepositoryManifest(const std::string& dir,
                                                          const ModelSpec& defaults,
                                                          std::vector<std::string>* problems) {
  auto models = ScanRepository(dir, defaults);
  if (!models.ok()) return models.status();
  std::vector<ModelSpec> specs;
  for (const RepositoryModel& m : *models) {
    if (!m.problem.empty()) {
      problems->push_back(absl::StrCat("model ", m.name, ": ", m.problem));
      continue;
    }
    for (const RepositoryVersion& v : m.versions)
      if (!v.problem.empty())
        problems->push_back(
            absl::StrCat("model ", m.name, " version ", v.version, ": ", v.problem));
    for (const std::string& why : m.ignored)
      problems->push_back(absl::StrCat("model ", m.name, ": ", why));
    const std::vector<int64_t> wanted = PolicyVersions(m);
    if (wanted.empty())
      problems->push_back(absl::StrCat("model ", m.name, ": no version to serve"));
    for (const RepositoryVersion& v : m.versions)
      if (std::binary_search(wanted.begin(), wanted.end(), v.version))
        specs.push_back(SpecFor(m, v));
  }
  if (specs.empty())
    return absl::NotFoundError(absl::StrCat("model repository ", dir, ": nothing to serve"));
  return specs;
}

}  // namespace krause::server

namespace krause::server {

std::string VersionFingerprint(const RepositoryModel& model, const RepositoryVersion& version) {
  return absl::StrCat(version.fingerprint, "|", model.config_fingerprint);
}

RepositoryPlan PlanRepository(const std::vector<RepositoryModel>& repo,
                              const std::vector<ServedVersion>& served,
                              const std::vector<FailedVersion>& failed, const std::string& only,
                              int64_t version) {
  RepositoryPlan plan;
  const auto served_at = [&](const std::string& name, int64_t v) -> const ServedVersion* {
    for (const ServedVersion& s : served)
      if (s.key.name == name && s.key.version == v) return &s;
    return nullptr;
  };
  std::set<std::string> in_repo;
  for (const RepositoryModel& original : repo) {
    in_repo.insert(original.name);
    if (!only.empty() && original.name != only) continue;
    if (!original.problem.empty()) continue;
    RepositoryModel m = original;
    // Failed from these files: not loadable, unless a copy from earlier files serves (a failed
    // reload): then it stays wanted, keeps serving and is not loaded again.
    std::set<int64_t> keep;
    for (RepositoryVersion& v : m.versions) {
      if (!v.problem.empty()) continue;
      for (const FailedVersion& f : failed)
        if (f.key.name == m.name && f.key.version == v.version &&
            f.fingerprint == VersionFingerprint(m, v)) {
          if (served_at(m.name, v.version) != nullptr) {
            keep.insert(v.version);
          } else {
            v.problem = f.reason;
          }
        }
    }
    std::vector<int64_t> wanted;
    if (version != 0) {
      wanted.push_back(version);
    } else {
      wanted = PolicyVersions(m);
    }
    for (int64_t w : wanted) {
      const auto it = std::find_if(m.versions.begin(), m.versions.end(),
                                   [w](const RepositoryVersion& v) { return v.version == w; });
      if (it == m.versions.end()) continue;
      if (keep.count(w) > 0) continue;
      const std::string fp = VersionFingerprint(m, *it);
      const ServedVersion* s = served_at(m.name, w);
      if (s != nullptr && s->fingerprint == fp) continue;
      plan.load.push_back({SpecFor(m, *it), fp});
    }
    if (version != 0 || wanted.empty()) continue;
    for (const ServedVersion& s : served)
      if (s.key.name == m.name &&
          std::find(wanted.begin(), wanted.end(), s.key.version) == wanted.end())
        plan.unload.push_back(s.key);
  }
  if (only.empty())
    for (const ServedVersion& s : served)
      if (in_repo.count(s.key.name) == 0) plan.unload.push_back(s.key);
  std::sort(plan.unload.begin(), plan.unload.end());
  return plan;
}

}  // namespace krause::server
