#include "server/oip/oip_generate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/errors.h"
#include "server/core/image_input.h"
#include "server/edge/json_text.h"
#include "server/edge/status.h"
#include "server/edge/streamed_generation.h"
#include "server/oip/rest_reply.h"

namespace krause::server {
namespace oip {

absl::StatusOr<ParsedGenerate> ResolveGenerateBody(const GenerateBody& b, const ServedModel& m,
                                                   const FaultHook& fault) {
  // The order of krause.v1's ParseGenerate, so that a request wrong in two ways gets the same
  // error on both front ends.
  const ModelInfo& info = m.info();
  GenerateAsk ask;
  ask.images = b.num_images == 0 ? 1 : b.num_images;
  if (absl::Status st = CheckImageCount(info, ask.images); !st.ok()) return st;
  ParsedGenerate out;
  auto stream = ResolveStreamParams(b.update_interval_ms, b.stream_rows);
  if (!stream.ok()) return stream.status();
  out.stream = *stream;
  if (b.prompt_png) {
    if (fault) fault("decode");
    auto t = DecodePngImage(*b.prompt_png, "prompt_png",
                            ImageBounds{info.shape, m.name(), /*prompt=*/true});
    if (!t.ok()) return t.status();
    auto kept = PromptRows(*t, b.prompt_rows, info);
    if (!kept.ok()) return kept.status();
    ask.prompt = *std::move(kept);
  } else if (b.prompt_rows != 0) {
    return InvalidField("prompt_rows", absl::StrCat("prompt_rows is ", b.prompt_rows,
                                                    " but there is no prompt_png"));
  }
  if (b.label || b.class_index) {
    auto cls = m.ClassRow(b.label.has_value(), b.label.value_or(""), b.class_index.value_or(0),
                          b.label ? "label" : "class_index");
    if (!cls.ok()) return cls.status();
    ask.classes.assign(static_cast<size_t>(ask.images), *cls);
  }
  ask.temperature = b.temperature;
  ask.top_p = b.top_p;
  ask.top_k = b.top_k;
  ask.guidance = b.guidance;
  ask.seed = b.seed;
  ask.first_image = b.first_image;
  auto plan = ResolveGenerate(info, std::move(ask));
  if (!plan.ok()) return plan.status();
  out.plan = *std::move(plan);
  return out;
}

}  // namespace oip

namespace {

// Events keep their fields in the order written ("type" first), for people reading a stream.
using Json = nlohmann::ordered_json;

std::string Event(const Json& j) { return absl::StrCat("data: ", JsonText(j), "\n\n"); }

// One generation over HTTP: a StreamedGeneration whose chunks become Server-Sent Events (or,
// for /generate, parts of one JSON document written at the end).
class HttpGeneration final : public StreamedGeneration {
 public:
  HttpGeneration(const FrontEndContext* edge, const HttpRequest& request,
                 std::shared_ptr<HttpExchange> exchange, const HttpGenerateOptions& options)
      : StreamedGeneration(edge, kProtocolOipRest),
        o_(options),
        reply_(request, std::move(exchange)) {}

  void Run(const HttpRequest& request, const std::string& name, const std::string& version) {
    absl::Status st = reply_.Enter(book(), request);
    if (st.ok()) st = Guarded("Generate", [&] { return Begin(request, name, version); });
    if (!st.ok()) FinishCall(st);
  }

 private:
  absl::Status Begin(const HttpRequest& request, const std::string& name,
                     const std::string& version) {
    auto body = oip::ParseGenerateBody(request.body);
    if (!body.ok()) return body.status();
    Clock::time_point deadline = Clock::time_point::max();
    if (o_.deadline_ms > 0) deadline = book().start() + std::chrono::milliseconds(o_.deadline_ms);
    if (body->timeout_us > 0)
      deadline = std::min(deadline, book().start() + std::chrono::microseconds(body->timeout_us));
    // A client that leaves stops the images (the exchange runs this on a loop thread).
    std::weak_ptr<StreamedGeneration> weak = weak_from_this();
    reply_.exchange()->OnGone([weak] {
      if (auto self = weak.lock()) static_cast<HttpGeneration*>(self.get())->ClientGone();
    });
    return Submit(
        name, version,
        [&](const ServedModel& m) -> absl::StatusOr<ParsedGenerate> {
          auto parsed = oip::ResolveGenerateBody(*body, m, edge()->fault);
          if (!parsed.ok()) return parsed.status();
          if (!o_.stream) parsed->stream.rows = false;  // one document: images, no rows
          passes_ = parsed->plan.passes;
          return parsed;
        },
        deadline);
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
    const double n = static_cast<double>(passes_);
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
      if (o_.stream) out += Event(start);
    }
    if (o_.stream && !c.rows.empty()) {
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
    } else if (o_.stream) {
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
      if (o_.stream) {
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
      if (o_.stream) {
        out += Event(done);
      } else {
        done.erase("type");
        document_.update(done);
      }
    }
    if (!o_.stream) {
      if (c.first) {
        start.erase("type");
        document_.update(start);
      }
      WriteDone(true);  // kept until the call ends
      return;
    }
    HttpExchange* ex = reply_.exchange();
    if (!started_.exchange(true)) {
      HttpHeaders headers = reply_.echo();
      headers.emplace_back("Content-Type", "text/event-stream");
      headers.emplace_back("Cache-Control", "no-cache");
      headers.emplace_back("X-Accel-Buffering", "no");
      ex->StartStream(200, std::move(headers), {": ping\n\n", o_.ping_ms});
    }
    ex->Send(std::move(out));
    // The HTTP server writes in order and drops a client that stops reading (its write
    // timeout); one that reads too slowly for the stream is dropped here.
    WriteDone(!ex->Gone() && ex->Backlog() <= o_.max_backlog_bytes);
  }

  void EndCall(const grpc::Status& st) override {
    HttpExchange* ex = reply_.exchange();
    if (!started_.load()) {  // nothing sent yet: a plain answer
      if (st.ok()) {
        document_["images"] = std::move(document_images_);
        reply_.ok_body_ = JsonText(document_);
      } else if (ex->Gone()) {
        reply_.override_status_ = 499;  // nobody reads it
      }
      reply_.Finish(st);
      return;
    }
    if (!st.ok()) {
      Json e = {{"type", "error"},
                {"error", st.error_message()},
                {"code", GrpcCodeName(st.error_code())},
                {"status", HttpStatus(st.error_code())}};
      ex->Send(absl::StrCat("event: error\n", Event(e)));
    }
    ex->End();
  }

  const HttpGenerateOptions o_;
  RestReply reply_;
  int64_t passes_ = 1;
  std::atomic<bool> started_{false};  // the stream's head was sent
  std::string model_fields_;          // the reply pool's, one flush at a time
  Json document_ = Json::object();    // /generate: the answer, built chunk by chunk
  std::vector<Json> document_images_;
};

}  // namespace

void StartHttpGeneration(const FrontEndContext* edge, const HttpRequest& request,
                         std::shared_ptr<HttpExchange> exchange, const std::string& name,
                         const std::string& version, const HttpGenerateOptions& options) {
  auto call = std::make_shared<HttpGeneration>(edge, request, std::move(exchange), options);
  call->Run(request, name, version);
}

}  // namespace krause::server
