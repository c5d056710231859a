#include "server/oip/oip_http.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/edge/call_book.h"
#include "server/edge/http_call.h"
#include "server/edge/status.h"
#include "server/oip/oip_infer.h"
#include "server/oip/oip_json.h"
#include "server/oip/oip_repository.h"
#include "server/oip/oip_statistics.h"

namespace krause::server {
namespace {

// The path's parts after /v2/models/: name, version (may be empty), and the action ("" for the
// metadata, "ready", "infer", "stats"); nullopt when the path is not of that form.
struct ModelPath {
  std::string name, version, action;
};
std::optional<ModelPath> ParseModelPath(const std::vector<absl::string_view>& parts) {
  // parts: "", "v2", "models", name, [versions, v], [action]
  if (parts.size() < 4 || parts[3].empty()) return std::nullopt;
  ModelPath p;
  p.name = std::string(parts[3]);
  size_t at = 4;
  if (parts.size() > at + 1 && parts[at] == "versions") {
    if (parts[at + 1].empty()) return std::nullopt;
    p.version = std::string(parts[at + 1]);
    at += 2;
  }
  if (parts.size() == at) return p;
  if (parts.size() == at + 1 &&
      (parts[at] == "ready" || parts[at] == "infer" || parts[at] == "stats")) {
    p.action = std::string(parts[at]);
    return p;
  }
  return std::nullopt;
}

// A call in flight: its book and its reply live until the core's answer finishes it.
struct RestCall {
  RestCall(const FrontEndContext* edge, const char* rpc, const HttpRequest& request,
           std::shared_ptr<HttpExchange> exchange)
      : reply(request, std::move(exchange)),
        book(edge->gate, edge->observer, edge->request_log, rpc, kProtocolOipRest) {}
  void Finish(const absl::Status& st) {
    book.Finish(st, [this](const absl::Status& s) { reply.Finish(s); });
  }
  JsonReply reply;
  CallBook book;
};

// The call a refused request was for, from its path ("HTTP": none named).
const char* RefusedRpc(std::string_view path) {
  constexpr std::string_view kInfer = "/infer";
  const bool infer =
      path.size() >= kInfer.size() && path.substr(path.size() - kInfer.size()) == kInfer;
  return infer ? "ModelInfer" : nullptr;
}

}  // namespace

class OipRest::Handler {
 public:
  Handler(const OipRestOptions& options, const FrontEndContext* edge) : o_(options), edge_(edge) {}

  // On a loop thread: answers at once, or starts the work and returns (never waits).
  void Serve(HttpRequest request, std::shared_ptr<HttpExchange> ex) {
    const bool post = request.method == "POST";
    if (!post && request.method != "GET") return NotAllowed(ex.get(), "GET");
    const std::string path = request.target.substr(0, request.target.find('?'));
    std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
    if (parts.size() > 1 && parts.back().empty()) parts.pop_back();  // a trailing slash
    if (parts.size() < 2 || parts[0] != "" || parts[1] != "v2") return NotFound(ex.get(), path);
    const Registry* registry = edge_->registry.load();
    if (parts.size() == 4 && parts[2] == "health") {
      if (post) return NotAllowed(ex.get(), "GET");
      if (parts[3] == "live") return SendJson(ex.get(), 200, R"({"live":true})");
      if (parts[3] == "ready") {
        const bool ready = registry != nullptr && !edge_->gate->draining();
        return SendJson(ex.get(), ready ? 200 : 503,
                        ready ? R"({"ready":true})" : R"({"ready":false})");
      }
      return NotFound(ex.get(), path);
    }
    if (parts.size() == 2) {
      if (post) return NotAllowed(ex.get(), "GET");
      return Call(request, ex, "ServerMetadata", [](RestCall* call) {
        call->reply.ok_body_ = oip::ServerMetadataJson();
        return absl::OkStatus();
      });
    }
    if (parts.size() >= 3 && parts[2] == "repository") return Repository(request, ex, parts, path);
    if (parts[2] != "models") return NotFound(ex.get(), path);
    const bool all_stats = parts.size() == 4 && parts[3] == "stats";
    const std::optional<ModelPath> mp =
        all_stats ? std::optional<ModelPath>(ModelPath{"", "", "stats"}) : ParseModelPath(parts);
    if (!mp) return NotFound(ex.get(), path);
    if (mp->action == "stats") {  // the statistics extension
      if (post) return NotAllowed(ex.get(), "GET");
      return Call(request, ex, "ModelStatistics", [&](RestCall* call) -> absl::Status {
        if (edge_->stats == nullptr) return absl::UnimplementedError("no statistics kept");
        auto stats = oip::StatisticsOf(*registry, *edge_->stats, mp->name, mp->version);
        if (!stats.ok()) return stats.status();
        call->reply.ok_body_ = oip::StatisticsJson(*stats);
        return absl::OkStatus();
      });
    }
    const bool posted_action = mp->action == "infer";
    if (posted_action != post) return NotAllowed(ex.get(), post ? "GET" : "POST");
    if (mp->action == "ready") {
      if (registry == nullptr) return SendJson(ex.get(), 503, R"({"ready":false})");
      auto m = oip::FindModel(*registry, mp->name, mp->version);
      if (m.status().code() == absl::StatusCode::kUnavailable)  // unloaded by model control
        return SendJson(ex.get(), 503, R"({"ready":false})");
      if (!m.ok())
        return SendJson(ex.get(), HttpStatus(m.status().code()), ErrorJson(m.status().message()));
      const bool ready = !edge_->gate->draining();
      return SendJson(ex.get(), ready ? 200 : 503,
                      ready ? R"({"ready":true})" : R"({"ready":false})");
    }
    if (mp->action.empty()) {
      return Call(request, ex, "ModelMetadata", [&](RestCall* call) -> absl::Status {
        auto m = oip::FindModel(*registry, mp->name, mp->version);
        if (!m.ok()) return m.status();
        call->book.set_model(*m);
        call->reply.ok_body_ =
            oip::ModelMetadataJson(oip::MetadataOf(**m, registry->Versions(mp->name)));
        return absl::OkStatus();
      });
    }
    Start(request, ex, "ModelInfer", [&](const std::shared_ptr<RestCall>& call, bool* started) {
      return Infer(request, *mp, call, started);
    });
  }

 private:
  void NotAllowed(HttpExchange* ex, const char* allow) {
    SendJson(ex, 405, ErrorJson(absl::StrCat("method not allowed here; use ", allow)),
             {{"Allow", allow}});
  }

  void NotFound(HttpExchange* ex, const std::string& path) {
    SendJson(ex, 404,
             ErrorJson(absl::StrCat("no such path: ", path.substr(0, 128),
                                    " (the APIs are under /v2 and /krause.v1.KrauseService/)")));
  }

  // A counted call: through the gate, then `body`, which either finishes the call (an error, or
  // OK with the reply's body set: the call finishes here) or hands it to the core
  // (kStarted: the core's answer finishes it); the request log, the metrics, the reply.
  template <typename Body>
  void Start(const HttpRequest& request, const std::shared_ptr<HttpExchange>& ex, const char* rpc,
             Body&& body, bool admin = false) {
    auto call = std::make_shared<RestCall>(edge_, rpc, request, ex);
    absl::Status st = call->reply.Enter(call->book, request, admin);
    bool started = false;
    if (st.ok()) st = Guarded(rpc, [&] { return body(call, &started); });
    if (!started) call->Finish(st);
  }

  template <typename Body>
  void Call(const HttpRequest& request, const std::shared_ptr<HttpExchange>& ex, const char* rpc,
            Body&& body, bool admin = false) {
    Start(
        request, ex, rpc,
        [&](const std::shared_ptr<RestCall>& call, bool*) { return body(call.get()); }, admin);
  }

  // The model repository extension (oip_repository.h): POST /v2/repository/index and
  // /v2/repository/models/{name}/load|unload, admin calls.
  void Repository(const HttpRequest& request, const std::shared_ptr<HttpExchange>& ex,
                  const std::vector<absl::string_view>& parts, const std::string& path) {
    const bool index = parts.size() == 4 && parts[3] == "index";
    const bool change = parts.size() == 6 && parts[3] == "models" && !parts[4].empty() &&
                        (parts[5] == "load" || parts[5] == "unload");
    if (!index && !change) return NotFound(ex.get(), path);
    if (request.method != "POST") return NotAllowed(ex.get(), "POST");
    if (index) {
      return Call(
          request, ex, "RepositoryIndex",
          [&](RestCall* call) -> absl::Status {
            auto ready = oip::ParseRepositoryIndexJson(request.body);
            if (!ready.ok()) return ready.status();
            call->reply.ok_body_ = oip::RepositoryIndexJson(
                IndexOf(edge_->control.load(), *edge_->registry.load(), *ready));
            return absl::OkStatus();
          },
          /*admin=*/true);
    }
    const bool load = parts[5] == "load";
    const std::string model(parts[4]);
    Start(
        request, ex, load ? "RepositoryModelLoad" : "RepositoryModelUnload",
        [&](const std::shared_ptr<RestCall>& call, bool* started) -> absl::Status {
          auto params = oip::ParseRepositoryChangeJson(request.body);
          if (!params.ok()) return params.status();
          *started = true;  // the control thread's answer finishes the call (or a refusal, now)
          oip::StartRepositoryChange(edge_->control.load(), load, model, *params,
                                     [call](absl::Status st) { call->Finish(st); });
          return absl::OkStatus();
        },
        /*admin=*/true);
  }

  // Parses the body (read whole by the HTTP server, which answered 413 or 408 itself) and starts
  // the inference; its answer, on a model or reply thread, finishes the call. A client that
  // leaves cancels it (the core stops the work; a generation frees its cache slots at the next
  // decode step).
  absl::Status Infer(const HttpRequest& request, const ModelPath& mp,
                     const std::shared_ptr<RestCall>& call, bool* started) {
    std::optional<absl::string_view> header_length;
    const std::string_view hl = request.Header(oip::kInferenceHeaderLength);
    if (!hl.empty()) header_length = absl::string_view(hl.data(), hl.size());
    auto parsed = oip::ParseInferJson(request.body, mp.name, mp.version, header_length);
    if (!parsed.ok()) return parsed.status();
    auto binary = oip::TakeBinaryOutputs(&*parsed);
    if (!binary.ok()) return binary.status();
    oip::InferContext c;
    c.edge = edge_;
    c.book = &call->book;
    // The call's deadline: its `timeout` parameter (StartInfer), within the server's default.
    if (o_.deadline_ms > 0)
      c.deadline = call->book.start() + std::chrono::milliseconds(o_.deadline_ms);
    c.cancelled = [call] { return call->reply.exchange()->Gone(); };
    absl::Status st =
        oip::StartInfer(*edge_->registry.load(), std::move(*parsed), c,
                        [call, binary = *std::move(binary)](absl::StatusOr<oip::InferResponse> r) {
                          if (r.ok()) {
                            oip::InferResponseBody body = oip::ResponseBodyOf(*r, binary);
                            if (body.json_length >= 0) {  // binary outputs after the JSON
                              call->reply.ok_headers_.emplace_back(
                                  oip::kInferenceHeaderLength, std::to_string(body.json_length));
                              call->reply.ok_content_type_ = "application/octet-stream";
                            }
                            call->reply.ok_body_ = std::move(body.body);
                          }
                          call->Finish(r.status());
                        });
    *started = st.ok();
    return st;
  }

  const OipRestOptions o_;
  const FrontEndContext* const edge_;
};

OipRest::OipRest(const OipRestOptions& options, const FrontEndContext* edge)
    : handler_(std::make_unique<Handler>(options, edge)) {}

OipRest::~OipRest() = default;

HttpRoute OipRest::Route() const {
  HttpRoute r;
  r.prefix = "/v2";
  r.protocol = kProtocolOipRest;
  r.rpc = RefusedRpc;
  Handler* handler = handler_.get();
  r.handler = [handler](HttpRequest request, std::shared_ptr<HttpExchange> ex) {
    handler->Serve(std::move(request), std::move(ex));
  };
  return r;
}

}  // namespace krause::server
