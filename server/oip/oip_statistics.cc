#include "server/oip/oip_statistics.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace krause::server::oip {

absl::StatusOr<std::vector<ModelStats>> StatisticsOf(const Registry& registry,
                                                     const StatsBook& book, const std::string& name,
                                                     const std::string& version) {
  std::vector<std::pair<std::string, std::string>> served;
  if (name.empty()) {
    if (!version.empty()) return absl::InvalidArgumentError("a version needs a model name");
    for (const ModelRef& m : registry.models())
      served.emplace_back(m->name(), std::to_string(m->info().version));
    std::sort(served.begin(), served.end());
  } else {
    const std::vector<int64_t> versions = registry.Versions(name);
    if (versions.empty())
      return absl::NotFoundError(absl::StrCat("model ", name.substr(0, 64), " is not served"));
    for (int64_t v : versions) {
      if (version.empty() || version == std::to_string(v))
        served.emplace_back(name, std::to_string(v));
    }
    if (served.empty())
      return absl::NotFoundError(absl::StrCat("model ", name, " has no version ",
                                              version.substr(0, 32), "; it serves ",
                                              absl::StrJoin(versions, ", ")));
  }
  return book.Of(served);
}

std::string StatisticsJson(const std::vector<ModelStats>& stats) {
  using Json = nlohmann::ordered_json;
  auto duration = [](const StatDuration& d) { return Json{{"count", d.count}, {"ns", d.ns}}; };
  const StatDuration zero;
  Json list = Json::array();
  for (const ModelStats& s : stats) {
    Json batches = Json::array();
    for (const auto& [size, d] : s.batches)
      batches.push_back({{"batch_size", size},
                         {"compute_input", duration(zero)},
                         {"compute_infer", duration(d)},
                         {"compute_output", duration(zero)}});
    list.push_back({{"name", s.name},
                    {"version", s.version},
                    {"last_inference", s.last_inference_ms},
                    {"inference_count", s.inference_count},
                    {"execution_count", s.execution_count},
                    {"inference_stats",
                     {{"success", duration(s.success)},
                      {"fail", duration(s.fail)},
                      {"queue", duration(s.queue)},
                      {"compute_input", duration(zero)},
                      {"compute_infer", duration(s.compute_infer)},
                      {"compute_output", duration(zero)},
                      {"cache_hit", duration(zero)},
                      {"cache_miss", duration(zero)}}},
                    {"batch_stats", std::move(batches)}});
  }
  return Json{{"model_stats", std::move(list)}}.dump(-1, ' ', false,
                                                     Json::error_handler_t::replace);
}

}  // namespace krause::server::oip
