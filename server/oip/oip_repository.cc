#include "server/oip/oip_repository.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"

namespace krause::server::oip {

absl::StatusOr<std::string> RepositoryVersion(const Parameters& parameters, bool unload) {
  std::string version;
  for (const auto& [name, value] : parameters) {
    if (name == "version") {
      if (const auto* s = std::get_if<std::string>(&value)) {
        version = *s;
      } else {
        auto v = IntegerParameter("version", value);
        if (!v.ok()) return v.status();
        version = std::to_string(*v);
      }
    } else if (unload && name == "unload_dependents") {
      if (!std::holds_alternative<bool>(value))
        return absl::InvalidArgumentError("parameter unload_dependents must be true or false");
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown parameter \"", name.substr(0, 64), "\": ", unload ? "an unload" : "a load",
          " takes version", unload ? " and unload_dependents" : "",
          " (a model comes from the repository's files, not from the request)"));
    }
  }
  return version;
}

std::string RepositoryIndexJson(const std::vector<IndexEntry>& entries) {
  nlohmann::json out = nlohmann::json::array();
  for (const IndexEntry& e : entries) {
    nlohmann::json j = {
        {"name", e.name}, {"state", VersionStateName(e.state)}, {"reason", e.reason}};
    if (e.version != 0) j["version"] = std::to_string(e.version);
    out.push_back(std::move(j));
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void StartRepositoryChange(ModelControl* control, bool load, const std::string& model,
                           const Parameters& parameters, std::function<void(absl::Status)> done) {
  const char* rpc = load ? "RepositoryModelLoad" : "RepositoryModelUnload";
  if (control == nullptr) return done(NoModelControl(rpc));
  auto version = RepositoryVersion(parameters, !load);
  if (!version.ok()) return done(version.status());
  auto finish = [done = std::move(done)](absl::StatusOr<std::vector<IndexEntry>> r) {
    done(r.status());
  };
  if (load) {
    control->Load(model, *version, std::move(finish));
  } else {
    control->Unload(model, *version, std::move(finish));
  }
}

}  // namespace krause::server::oip
