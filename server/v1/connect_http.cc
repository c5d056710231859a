#include "server/v1/connect_http.h"

#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/rpc/status.pb.h"
#include "krause/v1/krause.pb.h"
#include "nlohmann/json.hpp"
#include "server/core/errors.h"
#include "server/edge/call_book.h"
#include "server/edge/http_call.h"
#include "server/edge/json_text.h"
#include "server/edge/status.h"
#include "server/v1/unary.h"

namespace krause::server {
namespace {

enum class Codec { kJson, kProto };

const char* ContentType(Codec c) {
  return c == Codec::kJson ? "application/json" : "application/proto";
}

// The protocol's name of a code: the gRPC name in lower snake case, but "canceled".
std::string ConnectCode(absl::StatusCode code) {
  if (code == absl::StatusCode::kCancelled) return "canceled";
  return absl::AsciiStrToLower(CodeName(code));
}

// The error's JSON body: code, message, and each google.rpc detail as its type and its
// serialized bytes in base64 (unpadded, as the protocol writes them).
std::string ErrorBody(const absl::Status& st) {
  nlohmann::json j = {{"code", ConnectCode(st.code())}, {"message", std::string(st.message())}};
  const google::rpc::Status rpc = RpcStatusOf(st);
  if (rpc.details_size() > 0) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& any : rpc.details()) {
      std::string value = absl::Base64Escape(any.value());
      while (!value.empty() && value.back() == '=') value.pop_back();
      const std::string& url = any.type_url();
      list.push_back({{"type", url.substr(url.rfind('/') + 1)}, {"value", std::move(value)}});
    }
    j["details"] = std::move(list);
  }
  return JsonText(j);
}

// Answers a request refused before it became a call (not counted: no method, no codec).
void Refuse(HttpExchange* ex, int http, absl::StatusCode code, const std::string& message,
            HttpHeaders headers = {}) {
  headers.emplace_back("Content-Type", "application/json");
  ex->Reply({http, std::move(headers), ErrorBody(absl::Status(code, message))});
}

// One call's answer, as CallBook sees it: the response in the request's codec, or the error.
class ConnectReply : public HttpCall {
 public:
  ConnectReply(const HttpRequest& request, std::shared_ptr<HttpExchange> exchange, Codec codec)
      : HttpCall(request, std::move(exchange)), codec_(codec) {}

  void Finish(const absl::Status& st) {
    std::string body;
    absl::Status out = st;
    if (out.ok()) {
      if (codec_ == Codec::kProto) {
        body = response_->SerializeAsString();
      } else {
        google::protobuf::util::JsonPrintOptions o;
        const auto printed = google::protobuf::util::MessageToJsonString(*response_, &body, o);
        if (!printed.ok())
          out = absl::InternalError(
              absl::StrCat("the response could not be written as JSON: ", printed.ToString()));
      }
    }
    if (out.ok()) {
      HttpHeaders headers = echo();
      headers.emplace_back("Content-Type", ContentType(codec_));
      exchange()->Reply({200, std::move(headers), std::move(body)});
      return;
    }
    HttpHeaders headers = ErrorHeaders(out.code());
    headers.emplace_back("Content-Type", "application/json");
    exchange()->Reply({HttpStatus(out.code()), std::move(headers), ErrorBody(out)});
  }

  void set_response(std::unique_ptr<google::protobuf::Message> m) { response_ = std::move(m); }

 private:
  const Codec codec_;
  std::unique_ptr<google::protobuf::Message> response_;
};

struct ConnectCall {
  ConnectCall(const FrontEndContext* edge, const char* rpc, const HttpRequest& request,
              std::shared_ptr<HttpExchange> exchange, Codec codec)
      : reply(request, std::move(exchange), codec),
        book(edge->gate, edge->observer, edge->request_log, rpc, kProtocolKrauseConnect) {}
  void Finish(const absl::Status& st) {
    book.Finish(st, [this](const absl::Status& s) { reply.Finish(s); });
  }
  ConnectReply reply;
  CallBook book;
};

// The request message from the body in its codec; InvalidArgument naming the message type and
// what is wrong.
absl::Status ParseRequest(const std::string& body, Codec codec, google::protobuf::Message* m) {
  const std::string& type = m->GetDescriptor()->full_name();
  if (codec == Codec::kProto) {
    if (m->ParseFromString(body)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not a binary ", type, " message"));
  }
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(body.empty() ? "{}" : body, m, o);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the request body is not a ", type, " in JSON: ",
                                                 std::string(parsed.message()).substr(0, 512)));
}

// Connect-Timeout-Ms: a positive integer of at most 10 digits; nullopt when absent.
absl::StatusOr<std::optional<int64_t>> TimeoutMs(const HttpRequest& request) {
  const std::string_view v = request.Header("Connect-Timeout-Ms");
  if (v.empty()) return std::optional<int64_t>();
  int64_t ms = 0;
  if (v.size() > 10 || !absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &ms) || ms < 1)
    return InvalidField("Connect-Timeout-Ms",
                        "Connect-Timeout-Ms must be a positive integer of at most 10 digits");
  return std::optional<int64_t>(ms);
}

template <typename Request, typename Response>
using StartFn = absl::Status (*)(const UnaryCallContext&, const Request&, Response*, UnaryDone);

}  // namespace

// One method's call: the gate, the request, the deadline, then the shared start (unary.h).
template <typename Request, typename Response>
static void RunUnary(const FrontEndContext* edge, int64_t deadline_ms, const char* rpc,
                     StartFn<Request, Response> start, const HttpRequest& http,
                     const std::shared_ptr<HttpExchange>& ex, Codec codec) {
  auto call = std::make_shared<ConnectCall>(edge, rpc, http, ex, codec);
  auto response = std::make_unique<Response>();
  Response* out = response.get();
  call->reply.set_response(std::move(response));
  absl::Status st = call->reply.Enter(call->book, http);
  Request request;
  if (st.ok()) st = ParseRequest(http.body, codec, &request);
  absl::StatusOr<std::optional<int64_t>> timeout = std::optional<int64_t>();
  if (st.ok()) {
    timeout = TimeoutMs(http);
    st = timeout.status();
  }
  if (st.ok()) {
    UnaryCallContext c{edge, &call->book, {}};
    const int64_t ms = timeout->value_or(deadline_ms);
    if (ms > 0) c.limits.deadline = call->book.start() + std::chrono::milliseconds(ms);
    c.limits.cancelled = [call] { return call->reply.exchange()->Gone(); };
    c.limits.share = call->book.share();
    st = Guarded(
        rpc, [&] { return start(c, request, out, [call](absl::Status s) { call->Finish(s); }); });
    if (st.ok()) return;  // the answer finishes the call
  }
  call->Finish(st);
}

// The call a request of `path` (under kPrefix) is: its method, when krause.v1 has it.
const char* MethodOf(std::string_view path) {
  const std::string_view method =
      path.substr(std::min(path.size(), sizeof(ConnectHttp::kPrefix) - 1));
  for (const char* m : {"ListModels", "GetModel", "Classify", "Score", "Inspect"})
    if (method == m) return m;
  return nullptr;
}

HttpRoute ConnectHttp::Route() const {
  HttpRoute r;
  r.prefix = kPrefix;
  r.protocol = kProtocolKrauseConnect;
  r.rpc = MethodOf;
  r.handler = [this](HttpRequest request, std::shared_ptr<HttpExchange> ex) { Serve(request, ex); };
  return r;
}

void ConnectHttp::Serve(const HttpRequest& request,
                        const std::shared_ptr<HttpExchange>& exchange) const {
  const std::string path = request.target.substr(0, request.target.find('?'));
  const std::string method = path.substr(sizeof(kPrefix) - 1);
  HttpExchange* ex = exchange.get();
  using C = absl::StatusCode;
  if (method == "Generate")
    return Refuse(ex, 501, C::kUnimplemented,
                  "Generate streams its answer: over HTTP use POST "
                  "/v2/models/{model}/generate_stream (Server-Sent Events)");
  if (method == "LoadModel" || method == "UnloadModel" || method == "RepositoryIndex")
    return Refuse(ex, 501, C::kUnimplemented,
                  "model control over HTTP is the repository extension: POST "
                  "/v2/repository/index, /v2/repository/models/{model}/load or /unload");
  const bool known = method == "ListModels" || method == "GetModel" || method == "Classify" ||
                     method == "Score" || method == "Inspect";
  if (!known)
    return Refuse(
        ex, 404, C::kUnimplemented,
        absl::StrCat("krause.v1.KrauseService has no method \"", method.substr(0, 64), "\""));
  if (request.method != "POST")
    return Refuse(ex, 405, C::kUnimplemented, "a call is a POST", {{"Allow", "POST"}});
  const std::string_view version = request.Header("Connect-Protocol-Version");
  if (!version.empty() && version != "1")
    return Refuse(ex, 400, C::kInvalidArgument,
                  "Connect-Protocol-Version: this server speaks version 1");
  const std::string_view encoding = request.Header("Content-Encoding");
  if (!encoding.empty() &&
      !absl::EqualsIgnoreCase(absl::string_view(encoding.data(), encoding.size()), "identity"))
    return Refuse(ex, 415, C::kUnimplemented,
                  "Content-Encoding: only identity (uncompressed bodies) is accepted",
                  {{"Accept-Encoding", "identity"}});
  std::string type(request.Header("Content-Type"));
  type = absl::AsciiStrToLower(absl::StripAsciiWhitespace(type.substr(0, type.find(';'))));
  Codec codec;
  if (type == "application/json") {
    codec = Codec::kJson;
  } else if (type == "application/proto") {
    codec = Codec::kProto;
  } else {
    return Refuse(ex, 415, C::kUnimplemented,
                  "Content-Type must be application/json or application/proto",
                  {{"Accept-Post", "application/json, application/proto"}});
  }
  if (method == "ListModels")
    RunUnary<v1::ListModelsRequest, v1::ListModelsResponse>(
        edge_, deadline_ms_, "ListModels", StartListModels, request, exchange, codec);
  else if (method == "GetModel")
    RunUnary<v1::GetModelRequest, v1::ModelInfo>(edge_, deadline_ms_, "GetModel", StartGetModel,
                                                 request, exchange, codec);
  else if (method == "Classify")
    RunUnary<v1::ClassifyRequest, v1::ClassifyResponse>(edge_, deadline_ms_, "Classify",
                                                        StartClassify, request, exchange, codec);
  else if (method == "Score")
    RunUnary<v1::ScoreRequest, v1::ScoreResponse>(edge_, deadline_ms_, "Score", StartScore, request,
                                                  exchange, codec);
  else
    RunUnary<v1::InspectRequest, v1::InspectResponse>(edge_, deadline_ms_, "Inspect", StartInspect,
                                                      request, exchange, codec);
}

}  // namespace krause::server
