// Hostile input and failures inside a call, through a real in-process server: an exception at any
// point of a call ends it with INTERNAL (counted, out of the gate), and PNGs that claim or decode
// to huge sizes are refused from their header before anything is allocated.
#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <netinet/in.h>
#include <png.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client/http_get.h"
#include "model/data/png.h"
#include "model/util/threads.h"
#include "server_fixture.h"
#include "test_util.h"

namespace krause::testing {
namespace {

namespace v1 = krause::v1;

// The process's resident set in bytes (/proc/self/statm: pages).
int64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * 4096;
}

uint32_t Crc32(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// A small valid PNG (h x w gray) whose IHDR is then rewritten to claim `claim_h` x `claim_w`
// RGB, with a correct CRC: a few hundred bytes that ask for claim_h * claim_w * 3 bytes.
std::string LyingPng(uint32_t claim_h, uint32_t claim_w) {
  auto small = EncodePng(at::zeros({28, 28, 1}, at::kByte));
  EXPECT_TRUE(small.ok());
  std::string png = *small;
  // Signature (8), then the IHDR chunk: length (4), "IHDR" (4), width, height (4 each), ...
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<char>((v >> (24 - 8 * i)) & 0xff);
  };
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  put32(16, claim_w);
  put32(20, claim_h);
  png[25] = 2;  // colour type RGB
  put32(29, Crc32(png.substr(12, 4 + 13)));
  return png;
}

// A genuine PNG of h x w gray zeros, written row by row (the test never holds the decoded
// image): a decompression bomb, about 1/1000 of its decoded size.
std::string BombPng(uint32_t h, uint32_t w) {
  std::string out;
  png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(p);
  png_set_write_fn(
      p, &out,
      [](png_structp s, png_bytep data, size_t n) {
        static_cast<std::string*>(png_get_io_ptr(s))->append(reinterpret_cast<char*>(data), n);
      },
      nullptr);
  png_set_IHDR(p, info, w, h, 8, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_compression_level(p, 9);
  png_write_info(p, info);
  std::vector<png_byte> row(w, 0);
  for (uint32_t y = 0; y < h; ++y) png_write_row(p, row.data());
  png_write_end(p, nullptr);
  png_destroy_write_struct(&p, &info);
  return out;
}

v1::Image Png(std::string bytes) {
  v1::Image im;
  im.set_png(std::move(bytes));
  return im;
}

double Count(const std::string& scrape, const std::string& rpc, const std::string& code) {
  auto v = client::PrometheusSample(scrape, "krause_requests_total",
                                    {{"rpc", rpc},
                                     {"protocol", "krause.v1"},
                                     {"model", rpc == "Classify" ? "vit" : "karm"},
                                     {"version", "1"},
                                     {"code", code}});
  return v.ok() ? *v : 0;
}

class HardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    krause::SetCpuThreads(1);
    models_ = WriteTinyModels("hardening", /*delay_ms=*/0);
  }
  void Start(std::function<void(const char*)> hook = nullptr) {
    server::ServerOptions o = LoopbackOptions(models_.manifest);
    o.metrics_listen = "127.0.0.1:0";
    o.drain_seconds = 30;  // a call left in the gate would hold Shutdown for this long
    o.fault_hook_for_test = std::move(hook);
    auto s = server::KrauseServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    stub_ = Stub(ClientFor(server_->port()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::filesystem::remove_all(models_.dir);
  }
  std::string Scrape() {
    auto t = client::HttpGet("127.0.0.1:" + std::to_string(server_->metrics_port()), "/metrics");
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : "";
  }
  grpc::Status Classify(const v1::Image& im, v1::ClassifyResponse* r = nullptr) {
    v1::ClassifyRequest req;
    req.set_model("vit");
    *req.add_images() = im;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::ClassifyResponse local;
    return stub_->Classify(&ctx, req, r ? r : &local);
  }
  grpc::Status Score(const v1::Image& im) {
    v1::ScoreRequest req;
    req.set_model("karm");
    *req.add_images() = im;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::ScoreResponse r;
    return stub_->Score(&ctx, req, &r);
  }
  // A 1-image Generate, optionally a completion of `prompt`'s first row; the messages it got.
  grpc::Status Generate(const v1::Image* prompt, int* messages = nullptr) {
    v1::GenerateRequest req;
    req.set_model("karm");
    req.set_seed(1);
    if (prompt) {
      *req.mutable_prompt() = *prompt;
      req.set_prompt_rows(1);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse m;
    int n = 0;
    while (reader->Read(&m)) ++n;
    if (messages) *messages = n;
    return reader->Finish();
  }

  TinyModels models_;
  std::unique_ptr<server::KrauseServer> server_;
  std::unique_ptr<v1::KrauseService::Stub> stub_;
};

// What gRPC (1.51, Debian 12) answers for request bytes that do not parse (docs/api.md).
constexpr grpc::StatusCode kUnparseableCode = grpc::StatusCode::UNIMPLEMENTED;

v1::Image Raw6(uint8_t v) { return server::EncodeRawImage(at::full({6, 6, 1}, v, at::kByte)); }
v1::Image Raw8(uint8_t v) { return server::EncodeRawImage(at::full({8, 8, 1}, v, at::kByte)); }

// Every point where a call's own code runs throws once in turn (a LibTorch error, whose text
// carries a C++ backtrace, and std::bad_alloc): the call ends with INTERNAL naming the RPC and an
// incident number, never the exception's text (that goes to the server's log), it is counted,
// it leaves the gate, the next call of the same kind succeeds, and Shutdown does not wait for a
// call that never left (drain_seconds is 30).
TEST_F(HardeningTest, AnExceptionAnywhereInACallEndsItWithInternalAndLeavesTheGate) {
  std::atomic<int> armed{0};  // 1: throw a LibTorch error at `target`, 2: bad_alloc
  std::string target;
  std::mutex mu;
  Start([&](const char* point) {
    std::lock_guard<std::mutex> lock(mu);
    if (armed.load() == 0 || target != point) return;
    const int kind = armed.exchange(0);
    TORCH_CHECK(kind != 1, "injected at ", target);  // c10::Error: what() has a backtrace
    throw std::bad_alloc();
  });
  auto arm = [&](const std::string& point, int kind) {
    std::lock_guard<std::mutex> lock(mu);
    target = point;
    armed = kind;
  };
  const v1::Image prompt = Raw6(9);
  struct Case {
    const char* rpc;
    const char* point;
    std::function<grpc::Status()> call;
  };
  const std::vector<Case> cases = {
      {"Classify", "decode", [&] { return Classify(Raw8(1)); }},
      {"Classify", "reply", [&] { return Classify(Raw8(2)); }},
      {"Score", "decode", [&] { return Score(Raw6(3)); }},
      {"Score", "reply", [&] { return Score(Raw6(4)); }},
      {"Generate", "decode", [&] { return Generate(&prompt); }},
      {"Generate", "flush", [&] { return Generate(nullptr); }},
  };
  std::map<std::string, int> internal;
  for (const Case& c : cases) {
    for (int kind : {1, 2}) {
      SCOPED_TRACE(std::string(c.rpc) + " at " + c.point +
                   (kind == 1 ? " (c10::Error)" : " (bad_alloc)"));
      arm(c.point, kind);
      const grpc::Status st = c.call();
      EXPECT_EQ(armed.load(), 0) << "the hook was not reached";
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INTERNAL) << st.error_message();
      EXPECT_NE(st.error_message().find(std::string(c.rpc) + ": internal error #"),
                std::string::npos)
          << st.error_message();
      // Nothing of the exception's text reaches the client: no message, no backtrace.
      for (const char* leaked : {"injected", "Exception raised from", "frame #", "bad_alloc"})
        EXPECT_EQ(st.error_message().find(leaked), std::string::npos) << st.error_message();
      ++internal[c.rpc];
      // The same call without the fault works.
      const grpc::Status again = c.call();
      EXPECT_TRUE(again.ok()) << again.error_message();
    }
  }
  // A call leaves the gate just after its status is sent: wait for that, briefly.
  EXPECT_TRUE(server_->gate().WaitIdle(std::chrono::steady_clock::now() + std::chrono::seconds(5)))
      << server_->gate().in_flight() << " call(s) in flight";
  const std::string scrape = Scrape();
  for (const auto& [rpc, n] : internal) {
    EXPECT_EQ(Count(scrape, rpc, "INTERNAL"), n) << rpc;
    EXPECT_EQ(Count(scrape, rpc, "OK"), n) << rpc;
  }
  // Nothing is left in flight, so the drain ends at once instead of after 30 s.
  const auto t0 = std::chrono::steady_clock::now();
  server_->Shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(25));
  server_.reset();
}

// A PNG is judged by its header: anything that is not the model's shape is refused before a
// pixel is decoded, so a 2 KB file claiming 100000 x 100000 x 3 or a genuine 12000 x 12000 bomb
// costs nothing (the resident set stays within 40 MB while several are in flight), with a message
// naming the field, the claimed size and what the model takes.
TEST_F(HardeningTest, PngBombsAreRefusedFromTheirHeaderWithoutDecoding) {
  Start();
  const std::string liar = LyingPng(100000, 100000);
  EXPECT_LT(liar.size(), 4096u);
  const std::string bomb = BombPng(12000, 12000);  // 144 MB decoded
  EXPECT_LT(bomb.size(), 2u << 20);

  // Warm up both paths so that their first-use allocations are not counted.
  ASSERT_TRUE(Classify(Raw8(5)).ok());
  ASSERT_TRUE(Generate(nullptr).ok());
  const int64_t rss0 = RssBytes();

  std::vector<std::thread> clients;
  std::atomic<int> refused{0};
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&] {
      for (const std::string* png : {&liar, &bomb}) {
        const grpc::Status c = Classify(Png(*png));
        EXPECT_EQ(c.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
        EXPECT_NE(c.error_message().find("images[0]: image is"), std::string::npos)
            << c.error_message();
        EXPECT_NE(c.error_message().find("but model vit takes 8x8x1"), std::string::npos)
            << c.error_message();
        const grpc::Status s = Score(Png(*png));
        EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
        const v1::Image prompt = Png(*png);
        const grpc::Status g = Generate(&prompt);
        EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
        EXPECT_NE(g.error_message().find("prompt: image is"), std::string::npos)
            << g.error_message();
        refused += 3;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(refused.load(), 18);
  const int64_t grown = RssBytes() - rss0;
  EXPECT_LT(grown, int64_t{40} << 20) << "resident set grew by " << grown << " bytes";

  const grpc::Status c = Classify(Png(liar));
  EXPECT_NE(c.error_message().find("100000x100000x3"), std::string::npos) << c.error_message();
  // Served calls still work, and nothing was left in flight.
  EXPECT_TRUE(Classify(Raw8(6)).ok());
  // A call leaves the gate just after its status is sent: wait for that, briefly.
  EXPECT_TRUE(server_->gate().WaitIdle(std::chrono::steady_clock::now() + std::chrono::seconds(5)))
      << server_->gate().in_flight() << " call(s) in flight";
}

// Request bytes that are not a valid message never reach the service: gRPC answers them itself.
// What it answers is documented in docs/api.md; the server is unaffected.
TEST_F(HardeningTest, AnUnparseableRequestIsRefusedByGrpcAndChangesNothing) {
  Start();
  auto ch = client::MakeChannel(ClientFor(server_->port()));
  ASSERT_TRUE(ch.ok());
  grpc::GenericStub generic(*ch);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  const char junk[] = {'\xff', '\xff', '\xff', '\xff', '\x0f'};
  grpc::Slice slice(junk, sizeof(junk));
  grpc::ByteBuffer request(&slice, 1);
  auto call = generic.PrepareUnaryCall(&ctx, "/krause.v1.KrauseService/Classify", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status st;
  call->Finish(&response, &st, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(st.error_code(), kUnparseableCode) << st.error_message();
  // A call leaves the gate just after its status is sent: wait for that, briefly.
  EXPECT_TRUE(server_->gate().WaitIdle(std::chrono::steady_clock::now() + std::chrono::seconds(5)))
      << server_->gate().in_flight() << " call(s) in flight";
  EXPECT_TRUE(Classify(Raw8(7)).ok());
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// /metrics runs on the event-driven HTTP server: a client trickling its request a byte a second
// and 200 idle connections hold no thread (each is closed after the 2 s request timeout), so a
// scrape beside them answers within 1 s (the one-connection-at-a-time endpoint of long ago waited
// 23 s; bench/http_bench.py measures 2,000 idle connections).
TEST_F(HardeningTest, SlowAndIdleMetricsClientsDoNotBlindTheScrape) {
  Start();
  const int port = server_->metrics_port();
  std::atomic<bool> stop{false};
  std::thread slow([&] {
    const int fd = ConnectLoopback(port);
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    for (size_t i = 0; i < request.size() && !stop.load(); ++i) {
      if (send(fd, request.data() + i, 1, MSG_NOSIGNAL) != 1) break;  // closed by the timeout
      for (int t = 0; t < 10 && !stop.load(); ++t)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    close(fd);
  });
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(ConnectLoopback(port));
  for (int fd : idle) EXPECT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto text = client::HttpGet("127.0.0.1:" + std::to_string(port), "/metrics", 10);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(text.ok()) << text.status();
  EXPECT_LT(seconds, 1.0) << "a scrape beside 200 idle connections and a slow client";
  if (text.ok()) {
    EXPECT_NE(text->find("krause_build_info"), std::string::npos);
  }
  stop = true;
  slow.join();
  for (int fd : idle) close(fd);
  // Other paths and methods.
  EXPECT_NE(RawHttp(port, "GET /other HTTP/1.0\r\n\r\n").find(" 404 "), std::string::npos);
  EXPECT_NE(RawHttp(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n").find(" 405 "),
            std::string::npos);
}

// With --metrics_tokens a scrape needs a bearer token (the scheme in any case).
TEST_F(HardeningTest, MetricsTokensAreRequiredWhenConfigured) {
  WriteText(models_.dir + "/scrape-tokens", "# Prometheus\nscrape-secret\n");
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.metrics_listen = "127.0.0.1:0";
  o.metrics_tokens_file = models_.dir + "/scrape-tokens";
  auto s = server::KrauseServer::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = std::move(*s);
  const int port = server_->metrics_port();
  auto get = [&](const std::string& auth) {
    return RawHttp(port, "GET /metrics HTTP/1.0\r\n" +
                             (auth.empty() ? "" : "Authorization: " + auth + "\r\n") + "\r\n");
  };
  EXPECT_NE(get("").find("401 Unauthorized"), std::string::npos);
  EXPECT_NE(get("Bearer wrong").find("401 Unauthorized"), std::string::npos);
  EXPECT_NE(get("Basic c2NyYXBlLXNlY3JldA==").find("401 Unauthorized"), std::string::npos);
  const std::string ok = get("Bearer scrape-secret");
  EXPECT_NE(ok.find("200 OK"), std::string::npos) << ok.substr(0, 200);
  EXPECT_NE(ok.find("krause_build_info"), std::string::npos);
  EXPECT_NE(get("bearer scrape-secret").find("200 OK"), std::string::npos);
  EXPECT_FALSE(client::HttpGet("127.0.0.1:" + std::to_string(port), "/metrics").ok());
}

// An idle server with a connected client stops at once: nothing is in flight, so the drain and
// gRPC's own shutdown have nothing to wait for (it took 2 s, gRPC's shutdown deadline, while a
// client kept its connection open).
TEST_F(HardeningTest, AnIdleServerWithAConnectedClientStopsAtOnce) {
  Start();
  ASSERT_TRUE(Classify(Raw8(3)).ok());  // the client's channel stays connected
  ASSERT_TRUE(server_->gate().WaitIdle(std::chrono::steady_clock::now() + std::chrono::seconds(5)));
  const auto t0 = std::chrono::steady_clock::now();
  server_->Shutdown();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 1.0) << "Shutdown of an idle server took " << seconds << " s";
  server_.reset();
}

// Prompts are bounded too: the model's width and channels, at most its height.
TEST_F(HardeningTest, APromptTallerThanTheModelIsRefused) {
  Start();
  const v1::Image tall = server::EncodeRawImage(at::zeros({7, 6, 1}, at::kByte));
  const grpc::Status g = Generate(&tall);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(g.error_message().find("prompt: image is 7x6x1 (HxWxC) but model karm takes prompts "
                                   "of width 6, 1 channel(s) and at most 6 rows"),
            std::string::npos)
      << g.error_message();
  const v1::Image short_prompt = server::EncodeRawImage(at::zeros({2, 6, 1}, at::kByte));
  EXPECT_TRUE(Generate(&short_prompt).ok());
}

// A manifest with values of the wrong JSON type: each is refused naming the model entry, the key
// and what it got (no silent conversion of 2.5 or "8" to an integer).
TEST(ManifestHardening, WrongTypesAreRefusedNamingTheKey) {
  struct Case {
    std::string model;  // the members of models[0] after "name" and "checkpoint"
    const char* error;
  };
  const std::vector<Case> cases = {
      {R"("max_batch_size": 2.5)", "models[0].max_batch_size must be an integer, got number 2.5"},
      {R"("max_batch_size": "8")", "models[0].max_batch_size must be an integer, got string"},
      {R"("max_batch_size": 1e30)", "models[0].max_batch_size must be an integer"},
      {R"("max_batch_size": 18446744073709551615)", "models[0].max_batch_size is too large"},
      {R"("max_batch_size": -5)", "models[0].max_batch_size must be in [1, 4096], got -5"},
      {R"("max_waiting": null)", "models[0].max_waiting must be an integer, got null"},
      {R"("default": 1)", "models[0].default must be true or false, got number"},
      {R"("cuda_graphs": "yes")", "models[0].cuda_graphs must be true or false, got string"},
      {R"("device": ["cpu"])", "models[0].device must be a string, got array"},
      {R"("kv_cache_dtype": 16)", "models[0].kv_cache_dtype must be a string, got number"},
      {R"("max_queue_delay_ms": {})",
       "models[0].max_queue_delay_ms must be an integer, got object"},
      {R"("batch": 4)", "models[0]: unknown key \"batch\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    const auto r = server::ParseManifest(
        R"({"models": [{"name": "m", "checkpoint": "m.safetensors", )" + c.model + "}]}", "/tmp");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(r.status().message()).find(c.error), std::string::npos) << r.status();
  }
  for (const std::string& bad :
       {std::string(R"({"models": [{"name": 5, "checkpoint": "m"}]})"),
        std::string(R"({"models": {"name": "m"}})"), std::string(R"({"models": [7]})"),
        std::string(R"({"models": [])"), std::string(100000, '[') + std::string(100000, ']')}) {
    const auto r = server::ParseManifest(bad, "/tmp");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad.substr(0, 60);
  }
  EXPECT_NE(
      std::string(server::ParseManifest(R"({"models": [{"name": 5, "checkpoint": "m"}]})", "/tmp")
                      .status()
                      .message())
          .find("models[0].name must be a string, got number"),
      std::string::npos);
}

// A classifier's max_images_per_request above its max_batch_size (requests are never split) stops
// the start naming the model and both values, instead of being clipped.
TEST(ManifestHardening, ImagesPerRequestOverTheBatchSizeIsRefused) {
  TinyModels models = WriteTinyModels("hardening-clip");
  const std::string manifest = models.dir + "/clip.json";
  WriteText(manifest, R"({"models": [{"name": "c", "checkpoint": "vit.safetensors",
                          "max_batch_size": 8, "max_images_per_request": 16}]})");
  const auto s = server::KrauseServer::Start(LoopbackOptions(manifest));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(std::string(s.status().message())
                .find("model c: max_images_per_request (16) is over max_batch_size (8)"),
            std::string::npos)
      << s.status();
  std::filesystem::remove_all(models.dir);
}

}  // namespace
}  // namespace krause::testing
