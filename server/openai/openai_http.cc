#include "server/openai/openai_http.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "model/data/png.h"
#include "server/core/registry.h"
#include "server/edge/call_book.h"
#include "server/edge/generation_collector.h"
#include "server/edge/http_call.h"
#include "server/edge/json_text.h"
#include "server/edge/status.h"
#include "server/openai/images_request.h"

namespace krause::server {
namespace {

using Json = nlohmann::ordered_json;

// The API's name of a core setting an error is about (the rest keep theirs).
std::string ParamOf(const std::string& field) {
  if (field == "num_images") return "n";
  if (field == "label" || field == "class_index") return "prompt";
  if (field == "prompt_rows") return "mask";
  return field;
}

// The API's error type for a status: what its SDKs and docs use.
const char* ErrorType(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnauthenticated:
      return "authentication_error";
    case absl::StatusCode::kPermissionDenied:
      return "permission_error";
    case absl::StatusCode::kResourceExhausted:
      return "rate_limit_error";
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      return "server_error";
    default:
      return "invalid_request_error";
  }
}

// {"error": {"message", "type", "param", "code"}}: param from the status's BadRequest, code the
// refusal's reason or the status code's name, in lower case.
std::string OpenAiErrorJson(const absl::Status& st) {
  const ErrorDetails d = DetailsOf(st);
  Json e;
  e["message"] = std::string(st.message());
  e["type"] = ErrorType(st.code());
  e["param"] = d.fields.empty() ? Json(nullptr) : Json(ParamOf(d.fields[0].first));
  e["code"] = absl::AsciiStrToLower(d.reason.empty() ? CodeName(st.code()) : d.reason);
  return JsonText(Json{{"error", std::move(e)}});
}

// One call of the API: the JSON answer, or its error shape with the code's HTTP status.
JsonReply OpenAiReply(const HttpRequest& request, std::shared_ptr<HttpExchange> exchange) {
  JsonReply reply(request, std::move(exchange));
  reply.error_body_ = &OpenAiErrorJson;
  return reply;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// When the model's checkpoint was written (Unix seconds; 0 when unknown): its `created`.
int64_t CreatedOf(const ModelInfo& info) {
  std::error_code ec;
  const auto t = std::filesystem::last_write_time(info.checkpoint, ec);
  if (ec) return 0;
  const auto sys = std::chrono::time_point_cast<std::chrono::seconds>(
      t - std::filesystem::file_time_type::clock::now() + std::chrono::system_clock::now());
  return sys.time_since_epoch().count();
}

// The API's usage: each sampled subpixel is a token of the output (an autoregressive model's),
// each kept subpixel of an edit's image one of the input; a class is not text, so no text tokens.
Json Usage(int64_t output_tokens, int64_t image_tokens) {
  return {{"input_tokens", image_tokens},
          {"input_tokens_details", {{"text_tokens", 0}, {"image_tokens", image_tokens}}},
          {"output_tokens", output_tokens},
          {"total_tokens", image_tokens + output_tokens}};
}

// A streamed image event of `type` with its PNG and the fields every image event has.
Json ImageEvent(const std::string& type, const std::string& png, const std::string& size) {
  return {{"type", type},
          {"b64_json", absl::Base64Escape(png)},
          {"created_at", UnixSeconds()},
          {"size", size},
          {"quality", "auto"},
          {"background", "opaque"},
          {"output_format", "png"}};
}

// POST /v1/images/generations and /v1/images/edits (`edit`): the collector's final output as the
// API's answer, or its rows as the stream's events.
class ImagesGeneration final : public GenerationCollector {
 public:
  ImagesGeneration(const FrontEndContext* edge, const HttpRequest& request,
                   std::shared_ptr<HttpExchange> exchange, const OpenAiOptions& options, bool edit)
      : GenerationCollector(edge, &book_),
        book_(edge->gate, edge->observer, edge->request_log, "Generate", kProtocolOpenAi),
        o_(options),
        reply_(OpenAiReply(request, std::move(exchange))),
        edit_(edit) {}

  void Run(const HttpRequest& request) {
    absl::Status st = reply_.Enter(book(), request);
    if (st.ok()) st = Guarded("Generate", [&] { return Begin(request); });
    if (!st.ok()) FinishCall(st);
  }

 private:
  absl::Status Begin(const HttpRequest& request) {
    auto r = edit_ ? openai::ParseImageEditForm(request.Header("Content-Type"), request.body)
                   : openai::ParseImagesRequest(request.body);
    if (!r.ok()) return r.status();
    stream_ = r->stream;
    partial_images_ = r->partial_images;
    auto found = edge()->registry.load()->Find(r->model, ModelKind::kGenerator, "");
    if (!found.ok()) return found.status();
    auto settings = openai::SettingsFor(*r, (*found)->info());
    if (!settings.ok()) return settings.status();
    const ImageShape& shape = (*found)->info().shape;
    kept_tokens_ = settings->prompt_rows * shape.width * shape.channels;
    if (stream_) {  // rows as they complete: the partial images are drawn from them
      settings->answer_once = false;
      settings->stream_rows = true;
    }
    Clock::time_point deadline = Clock::time_point::max();
    if (o_.deadline_ms > 0) deadline = book().start() + std::chrono::milliseconds(o_.deadline_ms);
    std::weak_ptr<GenerationCollector> weak = weak_from_this();
    reply_.exchange()->OnGone([weak] {
      if (auto self = weak.lock()) static_cast<ImagesGeneration*>(self.get())->ClientGone();
    });
    return Submit(*std::move(found), *settings, deadline);
  }

  void WriteChunk(GenerateStream::Chunk& c, std::vector<EncodedImage> images) override {
    if (stream_) return WriteEvents(c, std::move(images));
    // The final output: one chunk with every image, in order, and the summary.
    Json data = Json::array();
    for (EncodedImage& im : images)
      data.push_back({{"b64_json", absl::Base64Escape(im.png)}, {"seed", im.seed}});
    const GenerateStream::Summary& s = c.summary;
    Json usage = Usage(s.pixels_generated, kept_tokens_);
    usage["images"] = s.images;
    usage["seconds"] = s.seconds;
    usage["flops_executed"] = s.flops_executed;
    usage["flops_dense_equivalent"] = s.flops_dense_equivalent;
    const ImageShape& shape = model().info().shape;
    reply_.ok_body_ = JsonText(Json{{"created", UnixSeconds()},
                                    {"data", std::move(data)},
                                    {"output_format", "png"},
                                    {"size", absl::StrCat(shape.width, "x", shape.height)},
                                    {"usage", std::move(usage)},
                                    {"model", model().name()},
                                    {"seed", s.seed}});
    WriteDone(true);
  }

  // The streamed answer: `image_generation.partial_image` events as an image's rows arrive (up
  // to partial_images of them, at even fractions of its height, the rows below black), then
  // `image_generation.completed` with the image and its usage.
  void WriteEvents(GenerateStream::Chunk& c, std::vector<EncodedImage> images) {
    const ImageShape& shape = model().info().shape;
    const int64_t row_bytes = shape.width * shape.channels;
    if (canvases_.empty()) {
      canvases_.assign(static_cast<size_t>(c.images_total),
                       Canvas{std::string(static_cast<size_t>(shape.height * row_bytes), '\0')});
    }
    const std::string size = absl::StrCat(shape.width, "x", shape.height);
    const auto event = [&](const Json& j) {
      return absl::StrCat("event: ", j["type"].get<std::string>(), "\ndata: ", JsonText(j), "\n\n");
    };
    std::string out;
    for (const GenerateStream::Rows& r : c.rows) {
      Canvas& canvas = canvases_[r.image];
      std::copy(r.pixels.begin(), r.pixels.end(), canvas.pixels.begin() + r.first_row * row_bytes);
      canvas.rows = r.first_row + r.num_rows;
      // Partial image k shows the image's first ceil((k + 1) H / (partial_images + 1)) rows and
      // black below, whenever its rows have passed that far: the same bytes whatever the
      // stream's timing, even for an image whose rows all came in one chunk.
      for (;;) {
        const int64_t k = canvas.partials;
        const int64_t cut = ((k + 1) * shape.height + partial_images_) / (partial_images_ + 1);
        if (k >= partial_images_ || canvas.rows < cut) break;
        std::string part(canvas.pixels.begin(), canvas.pixels.begin() + cut * row_bytes);
        part.resize(canvas.pixels.size(), '\0');
        const at::Tensor hwc =
            at::from_blob(part.data(), {shape.height, shape.width, shape.channels}, at::kByte);
        auto png = EncodePng(hwc);
        if (!png.ok()) break;
        Json e = ImageEvent(EventType("partial_image"), *png, size);
        e["partial_image_index"] = k;
        e["image"] = r.image;
        out += event(e);
        ++canvas.partials;
      }
    }
    const int64_t per_image = shape.height * row_bytes - kept_tokens_;
    for (EncodedImage& im : images) {
      Json e = ImageEvent(EventType("completed"), im.png, size);
      e["usage"] = Usage(per_image, kept_tokens_);
      e["image"] = im.image;
      e["seed"] = im.seed;
      out += event(e);
    }
    HttpExchange* ex = reply_.exchange();
    if (!started_.exchange(true)) StartEventStream(reply_, o_.ping_ms);
    if (!out.empty()) ex->Send(std::move(out));
    WriteDone(KeepsUp(*ex, o_.max_backlog_bytes));
  }

  // A streamed event's type: a generation's or an edit's.
  std::string EventType(const char* what) const {
    return absl::StrCat(edit_ ? "image_edit." : "image_generation.", what);
  }

  void EndCall(const absl::Status& status) override {
    book_.Finish(status, [this](const absl::Status& st) {
      if (!started_.load()) return reply_.Finish(st);  // nothing streamed: a plain answer
      HttpExchange* ex = reply_.exchange();
      if (!st.ok())  // the stream's error, as the SDKs read one: an event with an "error"
        ex->Send(absl::StrCat("event: error\ndata: ", OpenAiErrorJson(st), "\n\n"));
      ex->End();
    });
  }

  struct Canvas {
    std::string pixels;  // the image so far, HWC; rows not drawn yet are 0
    int64_t rows = 0;    // rows drawn
    int64_t partials = 0;
  };

  CallBook book_;
  const OpenAiOptions o_;
  JsonReply reply_;
  const bool edit_;  // an edit (a form, image_edit.* events) or a generation
  bool stream_ = false;
  int64_t kept_tokens_ = 0;  // an edit's subpixels kept from its image
  int64_t partial_images_ = 0;
  std::atomic<bool> started_{false};  // the stream's head was sent
  std::vector<Canvas> canvases_;      // the reply pool's, one flush at a time
};

// GET /v1/models: every served model, the API's list.
void ListModels(const FrontEndContext* edge, const HttpRequest& request,
                std::shared_ptr<HttpExchange> ex) {
  auto call = std::make_shared<JsonReply>(OpenAiReply(request, std::move(ex)));
  CallBook book(edge->gate, edge->observer, edge->request_log, "ListModels", kProtocolOpenAi);
  absl::Status st = call->Enter(book, request);
  if (st.ok()) {
    st = Guarded("ListModels", [&] {
      Json data = Json::array();
      for (const ModelRef& m : edge->registry.load()->models())
        data.push_back({{"id", m->name()},
                        {"object", "model"},
                        {"created", CreatedOf(m->info())},
                        {"owned_by", "krause-serve"}});
      call->ok_body_ = JsonText(Json{{"object", "list"}, {"data", std::move(data)}});
      return absl::OkStatus();
    });
  }
  book.Finish(st, [&](const absl::Status& s) { call->Finish(s); });
}

// The API's 404 and 405, in its error shape.
void Refuse(HttpExchange* ex, int http, const std::string& message, HttpHeaders headers = {}) {
  const absl::Status st =
      http == 404 ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  SendJson(ex, http, OpenAiErrorJson(st), std::move(headers));
}

const char* RpcOf(std::string_view path) {
  if (path == "/v1/models") return "ListModels";
  if (path == "/v1/images/generations" || path == "/v1/images/edits") return "Generate";
  return nullptr;
}

}  // namespace

HttpRoute OpenAiRoute(const FrontEndContext* edge, const OpenAiOptions& options) {
  HttpRoute r;
  r.prefix = "/v1/";
  r.protocol = kProtocolOpenAi;
  r.rpc = RpcOf;
  r.handler = [edge, options](HttpRequest request, std::shared_ptr<HttpExchange> ex) {
    const std::string_view target = request.target;
    std::string path(target.substr(0, target.find('?')));
    if (path.size() > 1 && path.back() == '/') path.pop_back();
    if (path == "/v1/models") {
      if (request.method != "GET")
        return Refuse(ex.get(), 405, "use GET for /v1/models", {{"Allow", "GET"}});
      return ListModels(edge, request, std::move(ex));
    }
    if (path == "/v1/images/generations" || path == "/v1/images/edits") {
      if (request.method != "POST")
        return Refuse(ex.get(), 405, absl::StrCat("use POST for ", path), {{"Allow", "POST"}});
      auto call = std::make_shared<ImagesGeneration>(edge, request, ex, options,
                                                     path == "/v1/images/edits");
      return call->Run(request);
    }
    Refuse(ex.get(), 404,
           absl::StrCat("no such path: ", path.substr(0, 128),
                        " (this server's OpenAI API: GET /v1/models, POST "
                        "/v1/images/generations, POST /v1/images/edits)"));
  };
  return r;
}

}  // namespace krause::server
