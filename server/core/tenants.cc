#include "server/core/tenants.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/core/errors.h"

namespace krause::server {
namespace {

// A tenant's settings as one line wrote them (each one written or not).
struct Written {
  std::map<std::string, std::string> values;  // key -> text, as written
  int line = 0;
};

bool ValidName(absl::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  return true;
}

}  // namespace

absl::Status TenantRefusal(const TenantSpec& tenant, absl::string_view limit, int64_t value,
                           absl::string_view now) {
  absl::Status st =
      WithErrorInfo(absl::ResourceExhaustedError(absl::StrCat(
                        "tenant ", tenant.name, " is at its ", limit, " of ", value, " (", now,
                        "); retry later: other tenants are not limited by it")),
                    reason::kTenantLimit, "", kTenantLimitRetryDelay);
  st = WithMetadata(std::move(st), "tenant", tenant.name);
  return WithMetadata(std::move(st), "limit", limit);
}

absl::Status CheckPriority(const Share& share, int64_t priority, absl::string_view field) {
  if (priority < 0 || priority > kMaxPriority)
    return WithField(absl::InvalidArgumentError(absl::StrCat(
                         field, " ", priority, " is out of range [0, ", kMaxPriority, "]")),
                     field);
  const int allowed = share.spec ? share.spec->max_priority : kDefaultMaxPriority;
  if (priority > allowed)
    return absl::PermissionDeniedError(
        absl::StrCat(field, " ", priority, " is not allowed to tenant ", share.name(),
                     ": its max_priority is ", allowed, " (the token file's max_priority=)"));
  return absl::OkStatus();
}

const std::string& Share::name() const {
  static const std::string kDefault = "default";
  return spec ? spec->name : kDefault;
}

TenantTable::TenantTable() { tenants_.push_back(std::make_shared<const TenantSpec>()); }

int32_t TenantTable::Find(absl::string_view token) const {
  auto it = std::lower_bound(
      tokens_.begin(), tokens_.end(), token,
      [](const std::pair<std::string, int32_t>& e, absl::string_view t) { return e.first < t; });
  return it != tokens_.end() && it->first == token ? it->second : -1;
}

absl::StatusOr<TenantTable> TenantTable::Parse(absl::string_view text, const std::string& source) {
  std::vector<std::string> order;                             // tenants in the order first named
  std::map<std::string, Written> written;                     // tenant -> its settings, once
  std::map<std::string, std::pair<std::string, int>> tokens;  // token -> (tenant, line)
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const auto at = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", what));
    };
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string token(words[0]);
    std::string tenant = "default";
    Written w;
    w.line = line_no;
    for (size_t i = 1; i < words.size(); ++i) {
      std::pair<std::string, std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
      if (words[i].find('=') == absl::string_view::npos)
        return at(absl::StrCat("\"", words[i],
                               "\" is not KEY=VALUE (after the token: tenant=, "
                               "weight=, max_in_flight=, max_queued=, "
                               "max_slots=, max_priority=)"));
      if (kv.first == "tenant") {
        if (!ValidName(kv.second))
          return at(absl::StrCat("tenant \"", kv.second,
                                 "\" is not a name (1 to 64 of letters, digits, - _ .)"));
        tenant = kv.second;
      } else if (kv.first == "weight" || kv.first == "max_in_flight" || kv.first == "max_queued" ||
                 kv.first == "max_slots" || kv.first == "max_priority") {
        if (w.values.count(kv.first)) return at(absl::StrCat(kv.first, " is written twice"));
        w.values[kv.first] = kv.second;
      } else {
        return at(absl::StrCat("unknown setting \"", kv.first,
                               "\" (tenant, weight, max_in_flight, max_queued, max_slots, "
                               "max_priority)"));
      }
    }
    if (auto [it, fresh] = tokens.emplace(token, std::pair{tenant, line_no}); !fresh)
      return at(absl::StrCat("the token is already on line ", it->second.second));
    auto [it, first] = written.emplace(tenant, Written{});
    if (first) order.push_back(tenant);
    for (const auto& [key, value] : w.values) {
      auto [old, fresh] = it->second.values.emplace(key, value);
      if (!fresh && old->second != value)
        return at(absl::StrCat("tenant ", tenant, "'s ", key, " is ", value, " here but ",
                               old->second, " on line ", it->second.line));
      if (fresh) it->second.line = line_no;
    }
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
  TenantTable table;
  table.tenants_.clear();
  table.configured_ = true;
  std::map<std::string, int32_t> index;
  for (const std::string& name : order) {
    const Written& w = written[name];
    const auto bad = [&](const std::string& key, absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", w.line, ": tenant ", name, "'s ", key, " ", why));
    };
    TenantSpec spec;
    spec.name = name;
    for (const auto& [key, value] : w.values) {
      if (key == "weight") {
        if (!absl::SimpleAtod(value, &spec.weight) || !std::isfinite(spec.weight) ||
            spec.weight <= 0 || spec.weight > kMaxTenantWeight)
          return bad(key, absl::StrCat("must be a number in (0, ", kMaxTenantWeight, "], got \"",
                                       value, "\""));
        continue;
      }
      int64_t n;
      const int64_t hi = key == "max_priority" ? kMaxPriority : int64_t{1} << 30;
      if (!absl::SimpleAtoi(value, &n) || n < 0 || n > hi)
        return bad(key, absl::StrCat("must be an integer in [0, ", hi, "], got \"", value, "\""));
      if (key == "max_in_flight") spec.max_in_flight = n;
      if (key == "max_queued") spec.max_queued = n;
      if (key == "max_slots") spec.max_slots = n;
      if (key == "max_priority") spec.max_priority = static_cast<int>(n);
    }
    index[name] = static_cast<int32_t>(table.tenants_.size());
    table.tenants_.push_back(std::make_shared<const TenantSpec>(std::move(spec)));
  }
  for (const auto& [token, tenant] : tokens) table.tokens_.emplace_back(token, index[tenant.first]);
  return table;  // tokens_ sorted: std::map's order
}

}  // namespace krause::server
