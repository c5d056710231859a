// krause-loadgen's HTTP driver (--protocol http and openai, loadgen_drivers.h): classify as the
// REST infer (the images as one UINT8 JSON tensor, or with --http_binary as binary tensor data),
// generate as generate_stream (Server-Sent Events; the same seeds as krause.v1's calls) or, for
// openai, as POST /v1/images/generations (the same seeds, one JSON answer), over the kept-alive
// connections of client/http_load.h.
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/loadgen_drivers.h"

namespace krause::loadgen {
namespace {

class HttpDriver : public Driver {
 public:
  HttpDriver(LoadGen* gen, std::unique_ptr<krause::client::HttpLoadClient> http, bool openai)
      : gen_(gen), http_(std::move(http)), openai_(openai) {}

  void Issue(uint64_t n, bool classify, int k, bool measured, std::function<void()> done) override {
    std::string path, body;
    int64_t images = k;
    int64_t json_length = -1;
    if (classify) {
      path = "/v2/models/" + gen_->classify_model_name() + "/infer";
      const v1::RawImage& first = gen_->image(n * k).raw();
      const std::string head =
          absl::StrCat(R"({"inputs":[{"name":"image","datatype":"UINT8",)", R"("shape":[)", k, ",",
                       first.height(), ",", first.width(), ",", first.channels(), "]");
      if (gen_->options().http_binary) {  // the JSON, then the pixels as they are
        std::string pixels;
        for (int i = 0; i < k; ++i) pixels += gen_->image(n * k + i).raw().pixels();
        body = absl::StrCat(head, R"(,"parameters":{"binary_data_size":)", pixels.size(),
                            R"(}}],"parameters":{"binary_data_output":true}})");
        json_length = static_cast<int64_t>(body.size());
        body += pixels;
      } else {
        body = absl::StrCat(head, R"(,"data":[)");
        for (int i = 0; i < k; ++i) {
          for (unsigned char px : gen_->image(n * k + i).raw().pixels()) {
            absl::StrAppend(&body, static_cast<int>(px), ",");
          }
        }
        body.back() = ']';
        body += "}]}";
      }
    } else {
      const std::string& m = gen_->options().generate_model;
      const std::string model = m.empty() ? std::string("karm-fmnist") : m;
      const v1::GenerateRequest req = gen_->GenerateRequest(n, nullptr);
      images = req.num_images();
      if (openai_) {
        path = "/v1/images/generations";
        body =
            nlohmann::json{
                {"model", model}, {"prompt", ""}, {"n", req.num_images()}, {"seed", req.seed()}}
                .dump();
      } else {
        path = "/v2/models/" + model + "/generate_stream";
        body = nlohmann::json{{"num_images", req.num_images()},
                              {"seed", req.seed()},
                              {"update_interval_ms", req.update_interval_ms()}}
                   .dump();
      }
    }
    const char* rpc = classify ? "ModelInfer" : "Generate";
    http_->Post(
        path, std::move(body),
        [gen = gen_, rpc, classify, images, measured,
         done = std::move(done)](krause::client::HttpCallResult r) {
          gen->Record(rpc, measured, r.code, r.seconds, r.code == "OK" ? images : 0);
          if (measured && r.code == "OK" && !classify) {
            Stats& s = gen->stats();
            std::lock_guard<std::mutex> l(s.mu);
            if (r.first_event >= 0) s.first_chunk.push_back(r.first_event);
            if (r.first_pixel >= 0) s.first_pixel.push_back(r.first_pixel);
            s.chunk_gap.insert(s.chunk_gap.end(), r.gaps.begin(), r.gaps.end());
          }
          if (measured && r.code != "OK") gen->NoteError(r.error);
          gen->Ended(done);
        },
        json_length);
  }

 private:
  LoadGen* gen_;
  std::unique_ptr<krause::client::HttpLoadClient> http_;
  const bool openai_;
};

}  // namespace

std::unique_ptr<Driver> MakeHttpDriver(LoadGen* gen,
                                       std::unique_ptr<krause::client::HttpLoadClient> http,
                                       bool openai) {
  return std::make_unique<HttpDriver>(gen, std::move(http), openai);
}

}  // namespace krause::loadgen
