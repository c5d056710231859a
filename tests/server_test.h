// The end-to-end tests' fixture: an in-process krause-server on loopback ports over the tiny
// models (server_fixture.h), the worker states the tests wait for, a Generate call run to its
// end, raw request images, and raw HTTP over a loopback socket.
#pragma once

#include <ATen/ATen.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/data/png.h"
#include "model/util/threads.h"
#include "server/core/served_classifier.h"
#include "server/core/served_generator.h"
#include "server_fixture.h"

namespace krause::testing {

using std::chrono::milliseconds;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    krause::SetCpuThreads(1);
    models_ = WriteTinyModels("e2e");
    StartServer(LoopbackOptions(models_.manifest));
  }
  // karm-big's decode steps take at least `step_delay` (a hook on the engine thread), so that
  // its streams surely outlast what the tests do meanwhile.
  void StartServer(const server::ServerOptions& o, server::WorkerHooks hooks = {},
                   milliseconds step_delay = milliseconds(1)) {
    if (!hooks.on_decode_step)
      hooks.on_decode_step = [step_delay](const std::string& model, const server::DecodeEvent&) {
        if (model == "karm-big") std::this_thread::sleep_for(step_delay);
      };
    auto s = server::KrauseServer::Start(o, hooks);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    conn_ = ClientFor(server_->port());
    stub_ = Stub(conn_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::filesystem::remove_all(models_.dir);
  }
  // Stops the server and writes `tokens` as a token file: `o` with it, to start the server again
  // with (after what else the test sets).
  server::ServerOptions WithTokens(const std::string& tokens, server::ServerOptions o) {
    server_->Shutdown();
    WriteText(models_.dir + "/tokens", tokens);
    o.auth_tokens_file = models_.dir + "/tokens";
    return o;
  }
  // A served model's worker, to wait for states another thread reaches.
  template <typename Kind>
  Kind& Served(const std::string& name) {
    auto m = server_->registry().Find<Kind>(name);
    EXPECT_TRUE(m.ok()) << m.status();
    return **m;
  }
  server::GeneratorWorker& Worker(const std::string& name) {
    return Served<server::ServedGenerator>(name).worker();
  }
  // Polls `done` (up to 5 s): for states another thread reaches, never a fixed wait.
  template <typename F>
  static bool Eventually(F done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      if (done()) return true;
      std::this_thread::sleep_for(milliseconds(2));
    }
    return done();
  }
  // Waits (up to 5 s) until `model` holds no active or waiting sequence.
  bool SlotsFree(const std::string& model) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      if (Worker(model).active() == 0 && Worker(model).waiting() == 0) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  }

  TinyModels models_;
  std::unique_ptr<server::KrauseServer> server_;
  client::ConnectionOptions conn_;
  std::unique_ptr<v1::KrauseService::Stub> stub_;
};

// ServerTest with the HTTP port on as well (loopback, a free port): the REST front ends' tests.
class HttpServerTest : public ServerTest {
 protected:
  void SetUp() override {
    krause::SetCpuThreads(1);
    models_ = WriteTinyModels("http");
    StartServer(Options());
  }
  server::ServerOptions Options() {
    server::ServerOptions o = LoopbackOptions(models_.manifest);
    o.http_listen = "127.0.0.1:0";
    return o;
  }
  int port() const { return server_->http_port(); }
};

struct Stream {
  std::vector<v1::GenerateResponse> messages;
  grpc::Status status;
};

inline at::Tensor RandomImages(int64_t n, int64_t h, int64_t w, int64_t c, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(0, 256, {n, h, w, c}, gen, at::kLong).to(at::kByte);
}

// A request image of the raw kind (no PNG) from an [H, W, C] uint8 tensor.
inline v1::Image RawImage(const at::Tensor& hwc) { return server::EncodeRawImage(hwc); }

inline Stream RunGenerate(v1::KrauseService::Stub& stub, const v1::GenerateRequest& req,
                          double timeout_s = 0, const std::string& token = "") {
  grpc::ClientContext ctx;
  if (timeout_s > 0)
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  Stream s;
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse m;
  while (reader->Read(&m)) s.messages.push_back(m);
  s.status = reader->Finish();
  return s;
}

// The rows streamed for each image, reassembled, and the final PNGs decoded.
inline std::map<uint32_t, std::string> RowsOf(const Stream& s) {
  std::map<uint32_t, std::string> rows;
  for (const auto& m : s.messages)
    for (const auto& r : m.rows()) {
      EXPECT_EQ(r.first_row() * 6u, rows[r.image()].size()) << "rows arrive in order, once";
      rows[r.image()] += r.pixels();
    }
  return rows;
}

inline std::map<uint32_t, std::string> PngsOf(const Stream& s) {
  std::map<uint32_t, std::string> out;
  for (const auto& m : s.messages)
    for (const auto& im : m.images()) {
      auto t = DecodePng(im.png());
      EXPECT_TRUE(t.ok());
      const at::Tensor c = t->contiguous();
      out[im.image()] =
          std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), c.numel());
    }
  return out;
}

inline std::string InferPost(const std::string& model, const std::string& body) {
  return "POST /v2/models/" + model + "/infer HTTP/1.1\r\nHost: x\r\nContent-Type: " +
         "application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Everything the server sends on `fd` until it closes or 10 s pass.
inline std::string ReadAll(int fd) {
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.find("\r\n\r\n") != std::string::npos && out.find("}") != std::string::npos) break;
  }
  return out;
}

}  // namespace krause::testing
