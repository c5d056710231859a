// Generation over HTTP (server/v1/http_generation.h) against krause.v1's Generate: the same seed
// and settings give the same rows and PNG bytes (plain, guided, completion); a client that leaves
// frees its cache slots; a failure mid-stream is an `event: error`; bad input is a 4xx JSON
// error before any stream. With the TLS flags the REST port is HTTPS only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "https_client.h"
#include "server_test.h"

namespace krause::testing {
namespace {

using Json = nlohmann::json;

struct SseReply {
  std::string head;                // status line and headers
  std::vector<std::string> names;  // each event's name ("" for a data-only event)
  std::vector<Json> events;        // each event's data
  int pings = 0;                   // `: ping` comments
};

std::string Post(const std::string& path, const std::string& body) {
  // HTTP/1.0: the body runs to the connection's end (no chunked framing to undo here).
  return "POST " + path + " HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Everything until the server closes (at most 20 s), split into events.
SseReply ReadEvents(int fd) {
  const std::string all = ReadUntilClosed(fd, 20);
  SseReply r;
  const size_t end = all.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  r.head = all.substr(0, end);
  for (absl::string_view block : absl::StrSplit(all.substr(end + 4), "\n\n")) {
    std::string name, data;
    for (absl::string_view line : absl::StrSplit(block, '\n')) {
      if (line == ": ping") ++r.pings;
      if (absl::ConsumePrefix(&line, "event: ")) name = std::string(line);
      if (absl::ConsumePrefix(&line, "data: ")) data = std::string(line);
    }
    if (data.empty()) continue;
    r.names.push_back(name);
    r.events.push_back(Json::parse(data));
  }
  return r;
}

SseReply Sse(int port, const std::string& path, const std::string& body) {
  const int fd = SendHttp(port, Post(path, body));
  EXPECT_GE(fd, 0);
  SseReply r = ReadEvents(fd);
  close(fd);
  return r;
}

// The whole answer to a POST (status line, headers, body), until the server closes.
std::string Answer(int port, const std::string& path, const std::string& body) {
  return RawHttp(port, Post(path, body), 20);
}

// A 200 answer's JSON body (null, with a test failure, otherwise).
Json Document(int port, const std::string& path, const std::string& body) {
  const std::string all = Answer(port, path, body);
  const size_t end = all.find("\r\n\r\n");
  EXPECT_NE(all.find(" 200 "), std::string::npos) << all.substr(0, 300);
  if (end == std::string::npos) return Json();
  return Json::parse(all.substr(end + 4), nullptr, false);
}

// Rows per image as krause.v1 streams them (bytes), and the PNGs' bytes.
struct Images {
  std::map<uint32_t, std::string> rows, pngs;
};

Images FromEvents(const SseReply& r) {
  Images out;
  for (const Json& e : r.events) {
    if (e["type"] == "row") {
      const uint32_t image = e["image"];
      EXPECT_EQ(e["row"].get<size_t>() * 6, out.rows[image].size()) << "rows in order, once";
      for (const Json& v : e["pixels"]) out.rows[image] += static_cast<char>(v.get<int>());
    } else if (e["type"] == "image") {
      std::string png;
      EXPECT_TRUE(absl::Base64Unescape(e["png"].get<std::string>(), &png));
      out.pngs[e["image"].get<uint32_t>()] = png;
    }
  }
  return out;
}

Images FromStream(const Stream& s) {
  Images out;
  out.rows = RowsOf(s);
  for (const auto& m : s.messages)
    for (const auto& im : m.images()) out.pngs[im.image()] = im.png();
  return out;
}

class HttpGenerateTest : public ServerTest {
 protected:
  void SetUp() override {
    krause::SetCpuThreads(1);
    models_ = WriteTinyModels("http-generate");
    server::ServerOptions o = LoopbackOptions(models_.manifest);
    o.http_listen = "127.0.0.1:0";
    o.fault_hook_for_test = [this](const char* point) {
      if (std::string(point) == "flush" && fail_flush_at_ > 0 && ++flushes_ == fail_flush_at_)
        throw std::runtime_error("injected flush failure");
    };
    StartServer(o, {}, milliseconds(20));
  }
  std::atomic<int> fail_flush_at_{0}, flushes_{0};
};

// The same settings over HTTP and over krause.v1 give the same rows and PNG bytes: a plain
// generation of three images, a guided one with a label, and a completion of a prompt.
TEST_F(HttpGenerateTest, StreamedRowsAndPngsEqualKrauseV1Generate) {
  const at::Tensor prompt = RandomImages(1, 6, 6, 1, 9)[0];
  auto png = EncodePng(prompt);
  ASSERT_TRUE(png.ok());
  struct Case {
    std::string model, body;
    v1::GenerateRequest req;
  };
  std::vector<Case> cases(3);
  cases[0].model = "karm";
  cases[0].body = R"({"num_images": 3, "seed": 11, "temperature": 0.9, "top_k": 50})";
  cases[0].req.set_num_images(3);
  cases[0].req.set_seed(11);
  cases[0].req.set_temperature(0.9f);
  cases[0].req.set_top_k(50);
  cases[1].model = "karm-cond";
  cases[1].body = R"({"parameters": {"label": "two", "guidance": 3, "seed": 5, "num_images": 2}})";
  cases[1].req.set_label("two");
  cases[1].req.set_guidance(3);
  cases[1].req.set_seed(5);
  cases[1].req.set_num_images(2);
  cases[2].model = "arm";
  cases[2].body = R"({"seed": 4, "num_images": 2, "prompt_rows": 4, "prompt_png": ")" +
                  absl::Base64Escape(*png) + "\"}";
  cases[2].req.set_seed(4);
  cases[2].req.set_num_images(2);
  cases[2].req.mutable_prompt()->set_png(*png);
  cases[2].req.set_prompt_rows(4);
  for (Case& c : cases) {
    SCOPED_TRACE(c.model);
    c.req.set_model(c.model);
    const Stream native = RunGenerate(*stub_, c.req);
    ASSERT_TRUE(native.status.ok()) << native.status.error_message();
    const SseReply r =
        Sse(server_->http_port(), "/v2/models/" + c.model + "/generate_stream", c.body);
    EXPECT_NE(r.head.find(" 200 "), std::string::npos) << r.head;
    EXPECT_NE(r.head.find("Content-Type: text/event-stream"), std::string::npos) << r.head;
    EXPECT_NE(r.head.find("Cache-Control: no-cache"), std::string::npos) << r.head;
    EXPECT_NE(r.head.find("X-Accel-Buffering: no"), std::string::npos) << r.head;
    ASSERT_GE(r.events.size(), 3u);
    EXPECT_EQ(r.events.front()["type"], "start");
    EXPECT_EQ(r.events.front()["seed"], c.req.seed());
    EXPECT_EQ(r.events.back()["type"], "done");
    EXPECT_EQ(r.events.back()["done"], true);
    EXPECT_EQ(r.events.back()["images"], c.req.num_images());
    const Images http = FromEvents(r), want = FromStream(native);
    EXPECT_EQ(http.rows, want.rows);
    EXPECT_EQ(http.pngs, want.pngs);
    EXPECT_EQ(http.pngs.size(), c.req.num_images());
    // /generate: the same PNGs in one document.
    const Json doc = Document(server_->http_port(), "/v2/models/" + c.model + "/generate", c.body);
    ASSERT_EQ(doc["images"].size(), c.req.num_images()) << doc.dump();
    for (const Json& im : doc["images"]) {
      std::string png;
      ASSERT_TRUE(absl::Base64Unescape(im["png"].get<std::string>(), &png));
      EXPECT_EQ(png, want.pngs.at(im["image"].get<uint32_t>()));
    }
  }
}

// /generate answers one JSON document with every image's PNG, the same bytes as the stream's.
TEST_F(HttpGenerateTest, GenerateAnswersOneDocument) {
  const std::string body = R"({"num_images": 2, "seed": 21})";
  const SseReply streamed = Sse(server_->http_port(), "/v2/models/karm/generate_stream", body);
  const Json doc = Document(server_->http_port(), "/v2/models/karm/generate", body);
  EXPECT_EQ(doc["model_name"], "karm");
  EXPECT_EQ(doc["done"], true);
  EXPECT_EQ(doc["seed"], 21);
  ASSERT_EQ(doc["images"].size(), 2u);
  const Images want = FromEvents(streamed);
  for (const Json& im : doc["images"]) {
    std::string png;
    ASSERT_TRUE(absl::Base64Unescape(im["png"].get<std::string>(), &png));
    EXPECT_EQ(png, want.pngs.at(im["image"].get<uint32_t>()));
    EXPECT_GT(im["flops_executed"].get<double>(), 0);
  }
}

// A client that leaves mid-stream: its image stops at the next decode step and the cache-slot
// gauge is back to 0 within a second; the slot serves the next call.
TEST_F(HttpGenerateTest, ClientThatLeavesFreesItsSlotWithinASecond) {
  const int fd =
      SendHttp(server_->http_port(), Post("/v2/models/karm-big/generate_stream", R"({"seed": 3})"));
  ASSERT_GE(fd, 0);
  // Read until the first row has arrived: the stream is under way.
  std::string got;
  char buf[4096];
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  while (got.find("\"type\":\"row\"") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, n);
  }
  ASSERT_EQ(Worker("karm-big").active(), 1);
  close(fd);
  const auto left = std::chrono::steady_clock::now();
  bool freed = false;
  while (std::chrono::steady_clock::now() - left < std::chrono::seconds(1)) {
    const auto g = Served<server::ServedGenerator>("karm-big").Gauges();
    if (g.cache && g.cache->slots_in_use == 0) {
      freed = true;
      break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(freed) << "the slot is still held a second after the client left";
  // The call itself ends too (CANCELLED): nothing is left in flight.
  EXPECT_TRUE(Eventually([&] { return server_->gate().in_flight() == 0; }));
  const SseReply next = Sse(server_->http_port(), "/v2/models/karm/generate_stream", "{}");
  EXPECT_EQ(next.events.back()["type"], "done");
}

// A failure after the stream began: an `event: error` with the code and its HTTP status, then
// the end of the stream; the slot is freed.
TEST_F(HttpGenerateTest, FailureMidStreamIsAnErrorEvent) {
  fail_flush_at_ = 3;
  const SseReply r = Sse(server_->http_port(), "/v2/models/karm-big/generate_stream",
                         R"({"update_interval_ms": 10})");
  EXPECT_NE(r.head.find(" 200 "), std::string::npos) << r.head;
  ASSERT_FALSE(r.events.empty());
  EXPECT_EQ(r.names.back(), "error");
  EXPECT_EQ(r.events.back()["type"], "error");
  EXPECT_EQ(r.events.back()["code"], "INTERNAL");
  EXPECT_EQ(r.events.back()["status"], 500);
  for (const Json& e : r.events) EXPECT_NE(e["type"], "done");
  EXPECT_TRUE(SlotsFree("karm-big"));
}

// Bad input, an unknown model or a classifier: a 4xx JSON error naming the field before any
// stream starts; nothing is queued.
TEST_F(HttpGenerateTest, BadInputIsA4xxBeforeTheStream) {
  struct Case {
    std::string path, body;
    int status;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"karm", "not json", 400, "not valid JSON"},
      {"karm", "[1]", 400, "JSON object"},
      {"karm", R"({"lable": "x"})", 400, "unknown setting"},
      {"karm", R"({"num_images": 9})", 400, "num_images"},
      {"karm", R"({"num_images": -1})", 400, "num_images must be in [0, "},
      {"karm", R"({"seed": "7"})", 400, "seed must be an integer"},
      {"karm", R"({"temperature": 500})", 400, "temperature"},
      {"karm", R"({"top_p": 0})", 400, "top_p"},
      {"karm", R"({"stream_rows": 1})", 400, "stream_rows must be true or false"},
      {"karm", R"({"update_interval_ms": 5})", 400, "update_interval_ms"},
      {"karm", R"({"label": "two"})", 400, "label"},
      {"karm-cond", R"({"label": "seven"})", 400, "label"},
      {"karm-cond", R"({"label": "two", "class_index": 1})", 400, "at most one"},
      {"karm", R"({"prompt_rows": 2})", 400, "no prompt_png"},
      {"karm", R"({"prompt_png": "***", "prompt_rows": 2})", 400, "prompt_png is not valid"},
      {"karm", R"({"seed": 1, "parameters": {"seed": 2}})", 400, "given twice"},
      {"karm", R"({"timeout": -5})", 400, "timeout"},
      {"karm", R"({"priority": 3})", 400, "priority 3 is out of range [0, 2]"},
      {"karm", R"({"priority": 2})", 403, "max_priority is 1"},
      {"nope", "{}", 404, "nope"},
      {"vit", "{}", 400, "vit"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body);
    const SseReply r =
        Sse(server_->http_port(), "/v2/models/" + c.path + "/generate_stream", c.body);
    EXPECT_NE(r.head.find(" " + std::to_string(c.status) + " "), std::string::npos) << r.head;
    EXPECT_NE(r.head.find("application/json"), std::string::npos) << r.head;
    ASSERT_EQ(r.events.size(), 0u);
  }
  // The error body names the field (read whole, not as events).
  for (const Case& c : cases) {
    const std::string all =
        Answer(server_->http_port(), "/v2/models/" + c.path + "/generate_stream", c.body);
    EXPECT_NE(all.find(c.says), std::string::npos) << c.body << "\n" << all;
  }
  EXPECT_TRUE(SlotsFree("karm"));
  // GET is not how a generation is asked.
  const int fd =
      SendHttp(server_->http_port(), "GET /v2/models/karm/generate_stream HTTP/1.0\r\n\r\n");
  ASSERT_GE(fd, 0);
  const SseReply get = ReadEvents(fd);
  close(fd);
  EXPECT_NE(get.head.find(" 405 "), std::string::npos) << get.head;
}

// With --tls_cert/--tls_key the REST port serves HTTPS (with the token) and gives a plain-HTTP
// request no answer, so a token sent in clear is never read; with --tls_client_ca a client
// without a certificate gets nothing; --http_plaintext serves plain HTTP anyway.
TEST_F(HttpGenerateTest, RestIsHttpsOnlyWithTheTlsFlags) {
  server_->Shutdown();
  const std::string certs = models_.dir + "/certs";
  std::filesystem::create_directories(certs);
  const std::string script = std::string(KRAUSE_SOURCE_DIR) + "/tests/make_test_certs.sh";
  ASSERT_EQ(std::system(("sh " + script + " " + certs).c_str()), 0) << "openssl failed";
  WriteText(models_.dir + "/tokens", "secret\n");
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.http_listen = "127.0.0.1:0";
  o.tls_cert = certs + "/server.pem";
  o.tls_key = certs + "/server.key";
  o.auth_tokens_file = models_.dir + "/tokens";
  StartServer(o);
  const std::string get =
      "GET /v2/models/karm HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
      "Connection: close\r\n\r\n";
  const auto https = HttpsRequest(server_->http_port(), get, certs + "/ca.pem");
  ASSERT_TRUE(https.handshake_ok) << https.error;
  EXPECT_NE(https.received.find("HTTP/1.1 200"), std::string::npos) << https.received;
  EXPECT_NE(https.received.find("\"name\":\"karm\""), std::string::npos) << https.received;
  const int fd = SendHttp(server_->http_port(), get);
  ASSERT_GE(fd, 0);
  const std::string plain = ReadAll(fd);
  close(fd);
  EXPECT_EQ(plain, "") << "plain HTTP to the HTTPS port must get no answer";
  // A streamed generation over HTTPS.
  const std::string body = R"({"seed": 3})";
  const auto stream = HttpsRequest(
      server_->http_port(),
      "POST /v2/models/karm/generate_stream HTTP/1.0\r\nAuthorization: Bearer secret\r\n"
      "Content-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body,
      certs + "/ca.pem");
  EXPECT_NE(stream.received.find("\"type\":\"done\""), std::string::npos) << stream.received;
  server_->Shutdown();

  o.tls_client_ca = certs + "/ca.pem";
  StartServer(o);
  const auto without = HttpsRequest(server_->http_port(), get, certs + "/ca.pem");
  EXPECT_EQ(without.received.find("HTTP/"), std::string::npos) << without.received;
  const auto with = HttpsRequest(server_->http_port(), get, certs + "/ca.pem",
                                 certs + "/client.pem", certs + "/client.key");
  EXPECT_NE(with.received.find("HTTP/1.1 200"), std::string::npos) << with.error;
  server_->Shutdown();

  o.tls_client_ca = "";
  o.http_plaintext = true;
  StartServer(o);
  const int fd2 = SendHttp(server_->http_port(), get);
  ASSERT_GE(fd2, 0);
  const std::string allowed = ReadAll(fd2);
  close(fd2);
  EXPECT_NE(allowed.find("HTTP/1.1 200"), std::string::npos) << allowed;
}

}  // namespace
}  // namespace krause::testing
