#include "server/v1/http_generation.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/core/errors.h"
#include "server/edge/generation_collector.h"
#include "server/edge/http_call.h"
#include "server/edge/json_text.h"
#include "server/edge/status.h"
#include "server/v1/generate_body.h"

namespace krause::server {

namespace {

// Events keep their fields in the order written ("type" first), for people reading a stream.
using Json = nlohmann::ordered_json;

std::string Event(const Json& j) { return absl::StrCat("data: ", JsonText(j), "\n\n"); }

// A path of the route: /v2/models/{name}[/versions/{v}]/{generate, generate_stream}; nullopt
// when it is not of that form.
struct GeneratePath {
  std::string name, version;
  bool stream = false;
};
std::optional<GeneratePath> ParseGeneratePath(std::string_view path) {
  std::vector<std::string> parts = absl::StrSplit(std::string(path), '/');
  // "", "v2", "models", name, [versions, v], action
  if (parts.size() != 5 && parts.size() != 7) return std::nullopt;
  if (parts[0] != "" || parts[1] != "v2" || parts[2] != "models" || parts[3].empty())
    return std::nullopt;
  GeneratePath p;
  p.name = std::string(parts[3]);
  if (parts.size() == 7) {
    if (parts[4] != "versions" || parts[5].empty()) return std::nullopt;
    p.version = std::string(parts[5]);
  }
  p.stream = parts.back() == "generate_stream";
  return p;
}

// One generation over HTTP: the collector whose chunks become Server-Sent Events (or, for
// /generate, its final output written as one JSON document).
class HttpGeneration final : public GenerationCollector {
 public:
  HttpGeneration(const FrontEndContext* edge, const HttpRequest& request,
                 std::shared_ptr<HttpExchange> exchange, const HttpGenerationOptions& options,
                 bool stream)
      : GenerationCollector(edge, &book_),
        book_(edge->gate, edge->observer, edge->request_log, "Generate", kProtocolKrauseHttp),
        o_(options),
        stream_(stream),
        reply_(request, std::move(exchange)) {}

  void Run(const HttpRequest& request, const GeneratePath& path) {
    absl::Status st = reply_.Enter(book(), request);
    if (st.ok()) st = Guarded("Generate", [&] { return Begin(request, path); });
    if (!st.ok()) FinishCall(st);
  }

 private:
  absl::Status Begin(const HttpRequest& request, const GeneratePath& path) {
    auto settings = ParseGenerateBody(request.body);
    if (!settings.ok()) return settings.status();
    settings->answer_once = !stream_;  // /generate: one document, images and no rows
    Clock::time_point deadline = Clock::time_point::max();
    if (o_.deadline_ms > 0) deadline = book().start() + std::chrono::milliseconds(o_.deadline_ms);
    // A client that leaves stops the images (the exchange runs this on a loop thread).
    std::weak_ptr<GenerationCollector> weak = weak_from_this();
    reply_.exchange()->OnGone([weak] {
      if (auto self = weak.lock()) static_cast<HttpGeneration*>(self.get())->ClientGone();
    });
    return Submit(path.name, path.version, *settings, deadline);
  }

  // The fields every event of the call names, as JSON text: "model_name":..,"model_version":..
  const std::string& ModelFields() {
    if (model_fields_.empty()) {
      Json j = {{"model_name", model().name()},
                {"model_version", std::to_string(model().info().version)}};
      const std::string d = JsonText(j);
      model_fields_ = d.substr(1, d.size() - 2);
    }
    return model_fields_;
  }

  void WriteChunk(GenerateStream::Chunk& c, std::vector<EncodedImage> images) override {
    const ModelInfo& info = model().info();
    const double n = static_cast<double>(plan().passes);
    std::string out;
    Json start;
    if (c.first) {
      start = {{"type", "start"},
               {"model_name", model().name()},
               {"model_version", std::to_string(info.version)},
               {"seed", c.seed},
               {"first_image", c.first_image},
               {"num_images", c.images_total},
               {"height", info.shape.height},
               {"width", info.shape.width},
               {"channels", info.shape.channels}};
      if (stream_) out += Event(start);
    }
    if (stream_ && !c.rows.empty()) {
      const int64_t row_bytes = info.shape.width * info.shape.channels;
      for (const GenerateStream::Rows& r : c.rows) {
        for (int64_t i = 0; i < r.num_rows; ++i) {
          absl::StrAppend(&out, "data: {\"type\":\"row\",", ModelFields(), ",\"image\":", r.image,
                          ",\"row\":", r.first_row + i, ",\"pixels\":[");
          const uint8_t* p = r.pixels.data() + i * row_bytes;
          for (int64_t x = 0; x < row_bytes; ++x) {
            if (x > 0) out += ',';
            absl::StrAppend(&out, static_cast<int>(p[x]));
          }
          out += "]}\n\n";
        }
      }
    } else if (stream_) {
      out += Event({{"type", "progress"},
                    {"pixels_done", c.pixels_done},
                    {"pixels_total", c.pixels_total},
                    {"images_done", c.images_done},
                    {"images_total", c.images_total},
                    {"waiting", c.waiting}});
    }
    for (EncodedImage& im : images) {
      Json j = {{"type", "image"},
                {"model_name", model().name()},
                {"model_version", std::to_string(info.version)},
                {"image", im.image},
                {"seed", im.seed},
                {"png", absl::Base64Escape(im.png)},
                {"flops_executed", model().flops().executed_flops * n},
                {"flops_dense_equivalent", model().flops().dense_equivalent_flops * n}};
      if (stream_) {
        out += Event(j);
      } else {
        j.erase("type");
        j.erase("model_name");
        j.erase("model_version");
        document_images_.push_back(std::move(j));
      }
    }
    if (c.has_summary) {
      const GenerateStream::Summary& s = c.summary;
      Json done = {{"type", "done"},
                   {"done", true},
                   {"model_name", model().name()},
                   {"model_version", std::to_string(info.version)},
                   {"images", s.images},
                   {"pixels_generated", s.pixels_generated},
                   {"seconds", s.seconds},
                   {"seconds_to_first_pixel", s.seconds_to_first_pixel},
                   {"seed", s.seed},
                   {"flops_executed", s.flops_executed},
                   {"flops_dense_equivalent", s.flops_dense_equivalent}};
      if (stream_) {
        out += Event(done);
      } else {
        done.erase("type");
        document_.update(done);
      }
    }
    if (!stream_) {
      if (c.first) {
        start.erase("type");
        document_.update(start);
      }
      WriteDone(true);  // kept until the call ends
      return;
    }
    HttpExchange* ex = reply_.exchange();
    if (!started_.exchange(true)) StartEventStream(reply_, o_.ping_ms);
    ex->Send(std::move(out));
    WriteDone(KeepsUp(*ex, o_.max_backlog_bytes));  // a client too slow for the stream is dropped
  }

  void EndCall(const absl::Status& status) override {
    book_.Finish(status, [this](const absl::Status& st) {
      HttpExchange* ex = reply_.exchange();
      if (!started_.load()) {  // nothing sent yet: a plain answer
        if (st.ok()) {
          document_["images"] = std::move(document_images_);
          reply_.ok_body_ = JsonText(document_);
        }
        reply_.Finish(st);
        return;
      }
      if (!st.ok()) {
        Json e = {{"type", "error"},
                  {"error", std::string(st.message())},
                  {"code", CodeName(st.code())},
                  {"status", HttpStatus(st.code())}};
        ex->Send(absl::StrCat("event: error\n", Event(e)));
      }
      ex->End();
    });
  }

  CallBook book_;
  const HttpGenerationOptions o_;
  const bool stream_;
  JsonReply reply_;
  std::atomic<bool> started_{false};  // the stream's head was sent
  std::string model_fields_;          // the reply pool's, one flush at a time
  Json document_ = Json::object();    // /generate: the answer, built chunk by chunk
  std::vector<Json> document_images_;
};

// The call a refused request of the route was for.
const char* GenerateRpc(std::string_view) { return "Generate"; }

}  // namespace

HttpRoute HttpGenerationRoute(const FrontEndContext* edge, const HttpGenerationOptions& options) {
  HttpRoute r;
  r.prefix = "/v2/models/";
  r.last_segments = {"generate", "generate_stream"};
  r.protocol = kProtocolKrauseHttp;
  r.rpc = GenerateRpc;
  r.handler = [edge, options](HttpRequest request, std::shared_ptr<HttpExchange> ex) {
    const std::string_view target = request.target;
    const std::optional<GeneratePath> path = ParseGeneratePath(target.substr(0, target.find('?')));
    if (!path) {
      SendJson(ex.get(), 404,
               ErrorJson(absl::StrCat("no such path: ", std::string(target.substr(0, 128)),
                                      " (a generation is POST /v2/models/{model}[/versions/{v}]/"
                                      "generate or /generate_stream)")));
      return;
    }
    if (request.method != "POST") {
      SendJson(ex.get(), 405, ErrorJson("method not allowed here; use POST"), {{"Allow", "POST"}});
      return;
    }
    auto call = std::make_shared<HttpGeneration>(edge, request, ex, options, path->stream);
    call->Run(request, *path);
  };
  return r;
}

}  // namespace krause::server
