// Helpers for the end-to-end tests: tiny randomly initialised models written to a fresh folder,
// a manifest, an in-process KrauseServer on a loopback port, and client stubs.
#pragma once

#include <ATen/core/grad_mode.h>
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "client/connection.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "krause/v1/krause.grpc.pb.h"
#include "model/loader.h"
#include "server/server.h"
#include "server/v1/images.h"

namespace krause::testing {

// A fresh folder under /tmp (ctest runs test cases in parallel processes).
inline std::string FreshDir(const std::string& tag) {
  std::string t = "/tmp/krause-" + tag + "-XXXXXX";
  if (mkdtemp(t.data()) == nullptr) return "";
  return t;
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Tiny models: a Krause ViT classifier on 8x8x1 with labels, a KARM and a softmax ARM on
// 6x6x1 (36 subpixels), a bigger KARM (16x16x3, 768 subpixels) for long streams, and a
// class-conditional KARM on 6x6x1 with the labels zero, one, two.
inline ViTConfig TinyViTConfig() {
  ViTConfig c;
  c.image_size = 8;
  c.patch = 4;
  c.d_model = 16;
  c.depth = 1;
  c.heads = 2;
  c.mlp = 32;
  c.classes = 3;
  c.labels = {"zero", "one", "two"};
  c.mean = {0.5};
  c.std = {0.25};
  return c;
}

inline PixelModelConfig TinyPixelModelConfig(const std::string& attention, int64_t h, int64_t w,
                                             int64_t ch) {
  PixelModelConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.height = h;
  c.width_px = w;
  c.channels = ch;
  c.d_model = 16;
  c.depth = 1;
  c.heads = 2;
  c.window = 8;
  c.top_k = 4;
  return c;
}

struct TinyModels {
  std::string dir;
  std::string manifest;
};

// Writes the models and a manifest with small limits chosen for the tests:
//   vit:       max_batch_size 8, max_queue_delay_ms `delay_ms`, max_queued_images `max_queued`
//   karm, arm: max_sequences 4, max_waiting `max_waiting`, max_images_per_request 8 (karm)
//   karm-big:  max_sequences 1, max_waiting 1
//   karm-cond: max_sequences 4, max_waiting `max_waiting`, max_images_per_request 8
inline TinyModels WriteTinyModels(const std::string& tag, int delay_ms = 20, int max_waiting = 8,
                                  int max_queued = 16) {
  TinyModels t;
  t.dir = FreshDir(tag);
  auto vit = ViT::Create(TinyViTConfig(), 1);
  auto karm = PixelModel::Create(TinyPixelModelConfig("krause", 6, 6, 1), 2);
  auto arm = PixelModel::Create(TinyPixelModelConfig("softmax", 6, 6, 1), 3);
  auto big = PixelModel::Create(TinyPixelModelConfig("krause", 16, 16, 3), 4);
  PixelModelConfig cc = TinyPixelModelConfig("krause", 6, 6, 1);
  cc.classes = 3;
  cc.labels = {"zero", "one", "two"};
  auto cond = PixelModel::Create(cc, 5);
  EXPECT_TRUE(vit.ok() && karm.ok() && arm.ok() && big.ok() && cond.ok());
  {
    at::NoGradGuard no_grad;  // classes that clearly change the draws
    cond->parameters().Get("class_emb.weight").mul_(40);
  }
  EXPECT_TRUE(SaveModel(t.dir + "/cond.safetensors", *cond).ok());
  EXPECT_TRUE(SaveModel(t.dir + "/vit.safetensors", *vit).ok());
  EXPECT_TRUE(SaveModel(t.dir + "/karm.safetensors", *karm).ok());
  EXPECT_TRUE(SaveModel(t.dir + "/arm.safetensors", *arm).ok());
  EXPECT_TRUE(SaveModel(t.dir + "/big.safetensors", *big).ok());
  t.manifest = t.dir + "/manifest.json";
  WriteText(t.manifest, R"({"models": [
    {"name": "vit", "checkpoint": "vit.safetensors", "max_batch_size": 8,
     "max_queue_delay_ms": )" +
                            std::to_string(delay_ms) + R"(, "max_queued_images": )" +
                            std::to_string(max_queued) + R"(},
    {"name": "karm", "checkpoint": "karm.safetensors", "default": true,
     "max_sequences": 4, "max_waiting": )" +
                            std::to_string(max_waiting) + R"(, "max_images_per_request": 8},
    {"name": "arm", "checkpoint": "arm.safetensors", "max_sequences": 4, "max_waiting": )" +
                            std::to_string(max_waiting) + R"(},
    {"name": "karm-big", "checkpoint": "big.safetensors", "max_sequences": 1, "max_waiting": 1},
    {"name": "karm-cond", "checkpoint": "cond.safetensors", "max_sequences": 4, "max_waiting": )" +
                            std::to_string(max_waiting) + R"(, "max_images_per_request": 8}
  ]})");
  return t;
}

inline server::ServerOptions LoopbackOptions(const std::string& manifest) {
  server::ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";  // off unless a test asks for it
  o.http_listen = "";     // the same
  o.manifest = manifest;
  o.quiet = true;
  o.drain_seconds = 5;
  return o;
}

inline client::ConnectionOptions ClientFor(int port) {
  client::ConnectionOptions c;
  c.server = "127.0.0.1:" + std::to_string(port);
  return c;
}

inline std::unique_ptr<v1::KrauseService::Stub> Stub(const client::ConnectionOptions& c) {
  auto ch = client::MakeChannel(c);
  EXPECT_TRUE(ch.ok());
  return v1::KrauseService::NewStub(*ch);
}

// A TCP connection to 127.0.0.1:port (-1 when none), for tests that speak HTTP by hand.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A TCP connection to 127.0.0.1:port that has sent `request` (-1 when it could not connect).
inline int SendHttp(int port, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd >= 0 && send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
                     static_cast<ssize_t>(request.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends on `fd` until it closes, or until `seconds` pass without a byte.
inline std::string ReadUntilClosed(int fd, int seconds = 10) {
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

// `request` on a new loopback connection, and all the server sends until it closes ("" when it
// could not connect).
inline std::string RawHttp(int port, const std::string& request, int seconds = 10) {
  const int fd = SendHttp(port, request);
  if (fd < 0) return "";
  std::string out = ReadUntilClosed(fd, seconds);
  close(fd);
  return out;
}

}  // namespace krause::testing
