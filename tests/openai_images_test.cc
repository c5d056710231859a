// OpenAI's Images API on the HTTP port (server/openai/openai_http.h) against krause.v1's
// Generate: the same class, count and seed give byte-identical PNGs (the prompt names the class
// in any case), and an edit is the completion of its image's rows above the mask's transparent
// band; /v1/models lists every served model; bad input is a 400 in the API's error shape
// naming the parameter (an unknown class lists the model's classes, a wrong size names the
// model's); a missing token is a 401 authentication_error. The official SDK's own test drives
// the same routes from Node.js when it is installed (docs/api.md).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "model/data/png.h"
#include "server/openai/images_request.h"
#include "server_test.h"

namespace krause::testing {
namespace {

using Json = nlohmann::json;

struct Answer {
  int status = 0;
  std::string head;
  Json body;
};

// The whole answer, head and body, of one HTTP/1.0 request.
std::string Send(int port, const std::string& method, const std::string& path,
                 const std::string& body, const std::string& headers = "",
                 const std::string& content_type = "application/json") {
  return RawHttp(port,
                 method + " " + path + " HTTP/1.0\r\nContent-Type: " + content_type + "\r\n" +
                     headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
                 20);
}

Answer AnswerOf(const std::string& all) {
  Answer a;
  const size_t end = all.find("\r\n\r\n");
  if (end == std::string::npos) return a;
  a.head = all.substr(0, end);
  a.status = std::stoi(a.head.substr(9, 3));
  a.body = Json::parse(all.substr(end + 4), nullptr, false);
  return a;
}

Answer Call(int port, const std::string& method, const std::string& path, const std::string& body,
            const std::string& headers = "") {
  return AnswerOf(Send(port, method, path, body, headers));
}

using OpenAiImagesTest = HttpServerTest;

TEST_F(OpenAiImagesTest, GenerationsArePngsByteIdenticalToKrauseV1Generate) {
  v1::GenerateRequest req;
  req.set_model("karm-cond");
  req.set_label("two");
  req.set_num_images(2);
  req.set_seed(7);
  const Stream native = RunGenerate(*stub_, req);
  ASSERT_TRUE(native.status.ok()) << native.status.error_message();
  std::vector<std::string> want(2);
  for (const auto& m : native.messages)
    for (const auto& im : m.images()) want[im.image()] = im.png();
  // The class in another case; size "WxH" of the model, and "auto".
  for (const char* size : {"6x6", "auto"}) {
    const Answer a =
        Call(port(), "POST", "/v1/images/generations",
             std::string(R"({"model": "karm-cond", "prompt": "TWO", "n": 2, )") +
                 R"("seed": 7, "response_format": "b64_json", "size": ")" + size + "\"}");
    ASSERT_EQ(a.status, 200) << a.body.dump();
    EXPECT_GT(a.body["created"].get<int64_t>(), 1700000000);
    ASSERT_EQ(a.body["data"].size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      std::string png;
      ASSERT_TRUE(absl::Base64Unescape(a.body["data"][i]["b64_json"].get<std::string>(), &png));
      EXPECT_EQ(png, want[i]) << "image " << i;
    }
    EXPECT_EQ(a.body["data"][0]["seed"], 7u);  // image 0 keeps the call's seed
    EXPECT_EQ(a.body["usage"]["output_tokens"], 2 * 36);
    EXPECT_EQ(a.body["usage"]["images"], 2);
  }
}

// stream: true: partial images as the rows arrive (here 2: the first 2 and 4 of the 6 rows, the
// rest black), then the completed image, the same PNG as the answer given once; the partial
// images are the same bytes in every run, whatever the stream's timing.
TEST_F(OpenAiImagesTest, AStreamShowsPartialImagesThenTheCompletedOne) {
  const std::string once = R"({"model": "karm-cond", "prompt": "one", "seed": 3})";
  const Answer a = Call(port(), "POST", "/v1/images/generations", once);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  const std::string want = a.body["data"][0]["b64_json"];
  const std::string body =
      R"({"model": "karm-cond", "prompt": "one", "seed": 3, "stream": true, "partial_images": 2})";
  const auto run = [&](std::vector<std::string>* names) {
    const std::string all = Send(port(), "POST", "/v1/images/generations", body);
    EXPECT_NE(all.find(" 200 "), std::string::npos) << all.substr(0, 300);
    EXPECT_NE(all.find("Content-Type: text/event-stream"), std::string::npos);
    std::vector<Json> events;
    size_t at = all.find("\r\n\r\n") + 4;
    while ((at = all.find("event: ", at)) != std::string::npos) {
      const size_t eol = all.find('\n', at);
      names->push_back(all.substr(at + 7, eol - at - 7));
      const size_t data = all.find("data: ", eol) + 6;
      events.push_back(Json::parse(all.substr(data, all.find('\n', data) - data)));
      at = data;
    }
    return events;
  };
  std::vector<std::string> names, again_names;
  const std::vector<Json> events = run(&names), again = run(&again_names);
  ASSERT_EQ(events.size(), 3u);
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(events[0]["b64_json"], again[0]["b64_json"]);
  EXPECT_EQ(events[1]["b64_json"], again[1]["b64_json"]);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(names[i], "image_generation.partial_image");
    EXPECT_EQ(events[i]["type"], "image_generation.partial_image");
    EXPECT_EQ(events[i]["partial_image_index"], i);
    EXPECT_NE(events[i]["b64_json"], want);  // not yet the whole image
  }
  EXPECT_EQ(names[2], "image_generation.completed");
  EXPECT_EQ(events[2]["b64_json"], want);
  // Partial k: the final image's first 2 (k + 1) rows, black below.
  const auto pixels = [](const Json& e) {
    std::string png;
    EXPECT_TRUE(absl::Base64Unescape(e.get<std::string>(), &png));
    auto t = DecodePng(png);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : at::Tensor();
  };
  const at::Tensor final_image = pixels(events[2]["b64_json"]);
  for (int64_t k = 0; k < 2; ++k) {
    const at::Tensor part = pixels(events[k]["b64_json"]);
    const int64_t rows = 2 * (k + 1);
    EXPECT_TRUE(part.narrow(0, 0, rows).equal(final_image.narrow(0, 0, rows))) << k;
    EXPECT_EQ(part.narrow(0, rows, 6 - rows).sum().item<int64_t>(), 0) << k;
  }
  EXPECT_EQ(events[2]["usage"]["output_tokens"], 36);
}

// A multipart/form-data body of text fields and PNG files, as the SDKs send an edit.
struct Form {
  std::vector<std::pair<std::string, std::string>> fields, files;
  std::string Body() const {
    std::string b;
    for (const auto& [name, value] : fields)
      b += "--BOUNDARY\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value +
           "\r\n";
    for (const auto& [name, png] : files)
      b += "--BOUNDARY\r\nContent-Disposition: form-data; name=\"" + name + "\"; filename=\"" +
           name + ".png\"\r\nContent-Type: image/png\r\n\r\n" + png + "\r\n";
    return b + "--BOUNDARY--\r\n";
  }
};

std::string SendEdit(int port, const Form& form) {
  return Send(port, "POST", "/v1/images/edits", form.Body(), "",
              "multipart/form-data; boundary=BOUNDARY");
}

Answer Edit(int port, const Form& form) { return AnswerOf(SendEdit(port, form)); }

// A 6x6 PNG of gray `pixels` and alpha 255 above row `from`, 0 from it down; or gray only.
std::string GrayAlphaPng(const std::string& gray, int64_t from) {
  std::string ga;
  for (size_t i = 0; i < gray.size(); ++i)
    ga += {gray[i], static_cast<char>(static_cast<int64_t>(i) / 6 < from ? 255 : 0)};
  return *EncodePngPixels(ga, 6, 6, 2);
}

// An edit is a completion: the image's rows above the mask's transparent bottom band are kept,
// and the PNGs are byte-identical to krause.v1 Generate's with that prompt, its rows and the same
// class and seed; without a mask the image's own alpha says the same.
TEST_F(OpenAiImagesTest, EditsCompleteTheImageAsKrauseV1Generate) {
  const at::Tensor image = RandomImages(1, 6, 6, 1, 5)[0];
  const std::string gray(reinterpret_cast<const char*>(image.data_ptr<uint8_t>()), 36);
  const std::string png = *EncodePng(image);
  v1::GenerateRequest req;
  req.set_model("karm-cond");
  req.set_label("two");
  req.set_num_images(2);
  req.set_seed(7);
  req.mutable_prompt()->set_png(png);
  req.set_prompt_rows(4);
  const Stream native = RunGenerate(*stub_, req);
  ASSERT_TRUE(native.status.ok()) << native.status.error_message();
  std::vector<std::string> want(2);
  for (const auto& m : native.messages)
    for (const auto& im : m.images()) want[im.image()] = im.png();
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"model", "karm-cond"}, {"prompt", "Two"}, {"n", "2"}, {"seed", "7"}};
  for (const Form& form : {Form{fields, {{"image", png}, {"mask", GrayAlphaPng(gray, 4)}}},
                           Form{fields, {{"image[]", GrayAlphaPng(gray, 4)}}}}) {
    const Answer a = Edit(port(), form);
    ASSERT_EQ(a.status, 200) << a.body.dump();
    ASSERT_EQ(a.body["data"].size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      std::string out;
      ASSERT_TRUE(absl::Base64Unescape(a.body["data"][i]["b64_json"].get<std::string>(), &out));
      EXPECT_EQ(out, want[i]) << "image " << i;
      const at::Tensor t = *DecodePng(out);
      EXPECT_TRUE(t.narrow(0, 0, 4).equal(image.narrow(0, 0, 4))) << "the kept rows, image " << i;
    }
    EXPECT_EQ(a.body["usage"]["input_tokens"], 4 * 6);    // the kept rows
    EXPECT_EQ(a.body["usage"]["output_tokens"], 2 * 12);  // the sampled ones, of both images
  }
  // Streamed: the edit's own events, the completed image the same PNG.
  Form streamed{{{"model", "karm-cond"},
                 {"prompt", "two"},
                 {"seed", "7"},
                 {"stream", "true"},
                 {"partial_images", "1"}},
                {{"image", png}, {"mask", GrayAlphaPng(gray, 4)}}};
  const std::string all = SendEdit(port(), streamed);
  const size_t partial = all.find("event: image_edit.partial_image\n");
  const size_t completed = all.find("event: image_edit.completed\n");
  ASSERT_NE(partial, std::string::npos) << all.substr(0, 300);
  ASSERT_NE(completed, std::string::npos) << all.substr(0, 300);
  EXPECT_LT(partial, completed);
  const size_t data = all.find("data: ", completed) + 6;
  const Json done = Json::parse(all.substr(data, all.find('\n', data) - data));
  EXPECT_EQ(done["type"], "image_edit.completed");
  EXPECT_EQ(done["b64_json"], absl::Base64Escape(want[0]));
  EXPECT_EQ(done["usage"]["output_tokens"], 12);
}

// An edit's bad input: a 400 naming the parameter and saying what would do.
TEST_F(OpenAiImagesTest, EditsRefuseMasksThatAreNotABottomBand) {
  const std::string gray(36, '\x40');
  const std::string png = *EncodePngPixels(gray, 6, 6, 1);
  std::string holed = gray, holed_ga;
  for (size_t i = 0; i < 36; ++i)  // transparent from row 3, but pixel (4, 2) is opaque
    holed_ga += {gray[i], static_cast<char>(i / 6 >= 3 && i != 4 * 6 + 2 ? 0 : 255)};
  const std::string hole = *EncodePngPixels(holed_ga, 6, 6, 2);
  const std::string small = *EncodePngPixels(std::string(8, '\0'), 2, 4, 1);
  struct Case {
    std::vector<std::pair<std::string, std::string>> files;
    std::string param, text;
  } cases[] = {
      {{{"image", png}, {"mask", hole}}, "mask", "not at row 4, column 2 (alpha 255)"},
      {{{"image", png}, {"mask", png}}, "mask", "has no fully transparent pixel"},
      {{{"image", png}}, "image", "no mask was sent"},
      {{{"image", small}}, "image", "is 4x2 but model karm-cond draws 6x6"},
      {{{"image", png}, {"mask", small}}, "mask", "is 4x2 but the image is 6x6"},
      {{{"image", "not a png"}}, "image", "cannot be read: not a valid PNG"},
      {{{"image", png}, {"image[]", png}}, "image", "sent twice"},
      {{{"mask", hole}}, "image", "is required"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const Answer a = Edit(port(), Form{{{"model", "karm-cond"}, {"prompt", "one"}}, c.files});
    EXPECT_EQ(a.status, 400) << a.body.dump();
    EXPECT_EQ(a.body["error"]["param"], c.param) << a.body.dump();
    EXPECT_NE(a.body["error"]["message"].get<std::string>().find(c.text), std::string::npos)
        << a.body.dump();
  }
  // The form's text fields are checked as the JSON body's are, and the body must be a form.
  Answer a = Edit(port(), Form{{{"model", "karm-cond"}, {"prompt", "one"}, {"n", "two"}},
                               {{"image", png}, {"mask", hole}}});
  EXPECT_EQ(a.body["error"]["param"], "n") << a.body.dump();
  EXPECT_NE(a.body["error"]["message"].get<std::string>().find("must be a number"),
            std::string::npos);
  a = Call(port(), "POST", "/v1/images/edits", R"({"model": "karm-cond", "prompt": "one"})");
  EXPECT_EQ(a.status, 400) << a.body.dump();
  EXPECT_NE(a.body["error"]["message"].get<std::string>().find("send multipart/form-data"),
            std::string::npos)
      << a.body.dump();
}

TEST_F(OpenAiImagesTest, ModelsAreListedInTheApisShape) {
  const Answer a = Call(port(), "GET", "/v1/models", "");
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.body["object"], "list");
  std::vector<std::string> ids;
  for (const Json& m : a.body["data"]) {
    ids.push_back(m["id"]);
    EXPECT_EQ(m["object"], "model");
    EXPECT_EQ(m["owned_by"], "krause-serve");
    EXPECT_GT(m["created"].get<int64_t>(), 0);
  }
  EXPECT_NE(std::find(ids.begin(), ids.end(), "karm-cond"), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), "vit"), ids.end());
}

TEST_F(OpenAiImagesTest, BadInputIsA400InTheApisErrorShapeNamingTheParameter) {
  struct Case {
    std::string body, param, text;
    int status = 400;
  } cases[] = {
      {R"({"model": "karm-cond", "prompt": "seven"})", "prompt", "its classes are zero, one, two"},
      {R"({"model": "karm-cond", "prompt": "one", "size": "1024x1024"})", "size",
       "draws 6x6 images"},
      {R"({"model": "karm-cond", "prompt": "one", "n": 9})", "n", "must be in [1, 8]"},
      {R"({"model": "karm-cond", "prompt": "one", "response_format": "url"})", "response_format",
       "keeps no images"},
      {R"({"model": "karm-cond", "prompt": "one", "temperature": -1})", "temperature",
       "temperature"},
      {R"({"model": "karm-cond", "prompt": "one", "colour": "red"})", "colour",
       "unknown parameter"},
      {R"({"model": "karm-cond"})", "prompt", "is required"},
      {R"({"model": "karm", "prompt": "one"})", "prompt", "unconditional"},
      {R"({"model": "nope", "prompt": ""})", "", "nope", 404},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const Answer a = Call(port(), "POST", "/v1/images/generations", c.body);
    EXPECT_EQ(a.status, c.status) << a.body.dump();
    const Json& e = a.body["error"];
    EXPECT_NE(e["message"].get<std::string>().find(c.text), std::string::npos) << e.dump();
    if (c.param.empty()) {
      EXPECT_TRUE(e["param"].is_null()) << e.dump();
    } else {
      EXPECT_EQ(e["param"], c.param) << e.dump();
    }
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_TRUE(e["code"].is_string());
  }
  // Not the API's: 404 in its shape.
  EXPECT_EQ(Call(port(), "GET", "/v1/chat/completions", "").status, 404);
}

TEST_F(OpenAiImagesTest, AMissingTokenIsAnAuthenticationError) {
  StartServer(WithTokens("secret\n", Options()));
  const std::string body = R"({"model": "karm-cond", "prompt": "zero", "seed": 1})";
  Answer a = Call(port(), "POST", "/v1/images/generations", body);
  EXPECT_EQ(a.status, 401) << a.body.dump();
  EXPECT_EQ(a.body["error"]["type"], "authentication_error");
  EXPECT_NE(a.head.find("WWW-Authenticate: Bearer"), std::string::npos) << a.head;
  a = Call(port(), "POST", "/v1/images/generations", body, "Authorization: Bearer secret\r\n");
  EXPECT_EQ(a.status, 200) << a.body.dump();
}

// The request's parser alone: the API's names to the settings, each once.
TEST(ImagesRequest, TheApisNamesBecomeTheCoresSettings) {
  auto r = server::openai::ParseImagesRequest(
      R"({"prompt": " One ", "n": 3, "seed": 9, "top_k": 0, "guidance": 2, "user": "u"})");
  ASSERT_TRUE(r.ok()) << r.status();
  server::ModelInfo m;
  m.name = "g";
  m.classes = 3;
  m.labels = {"zero", "one", "two"};
  m.shape = {6, 6, 1};
  m.max_images_per_request = 8;
  auto g = server::openai::SettingsFor(*r, m);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->num_images, 3);
  EXPECT_EQ(g->class_index, 1);
  EXPECT_EQ(g->seed, 9u);
  EXPECT_EQ(g->top_k, 0);
  EXPECT_EQ(g->guidance, 2.0);
  EXPECT_TRUE(g->answer_once);
  r->prompt = "2";  // an index
  EXPECT_EQ(server::openai::SettingsFor(*r, m)->class_index, 2);
  r->prompt = "";  // unconditional
  EXPECT_FALSE(server::openai::SettingsFor(*r, m)->class_index.has_value());
}

}  // namespace
}  // namespace krause::testing
