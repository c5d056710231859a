// The bundled Krause ViT classifies the whole Fashion-MNIST test set through the server (raw
// images, 64 per call, 4 concurrent clients, dynamic batching) and gets exactly the accuracy the
// model gets when run directly.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <atomic>
#include <thread>

#include "model/data/datasets.h"
#include "model/util/threads.h"
#include "server_fixture.h"
#include "test_util.h"

namespace krause::testing {
namespace {

TEST(ServerAccuracy, FashionMnistThroughTheServerEqualsDirect) {
  krause::SetCpuThreads(2);
  KRAUSE_ASSERT_OK_AND_ASSIGN(ImageDataset test,
                              LoadFashionMnist("/usr/share/datasets/fashion-mnist", false));
  const std::string checkpoint =
      std::string(KRAUSE_SOURCE_DIR) + "/models/krause_vit_fmnist.safetensors";
  if (!std::filesystem::exists(checkpoint)) GTEST_SKIP() << "no bundled classifier";
  const std::string dir = FreshDir("acc");
  WriteText(dir + "/manifest.json", R"({"models": [{"name": "kvit", "checkpoint": ")" + checkpoint +
                                        R"(", "max_batch_size": 256, "max_queue_delay_ms": 2}]})");
  auto server = server::KrauseServer::Start(LoopbackOptions(dir + "/manifest.json"));
  ASSERT_TRUE(server.ok()) << server.status();
  const auto conn = ClientFor((*server)->port());

  const int64_t n = test.size();
  std::vector<int64_t> served(n, -1);
  std::atomic<int64_t> next{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&] {
      auto stub = Stub(conn);
      for (;;) {
        const int64_t s = next.fetch_add(64);
        if (s >= n) return;
        const int64_t e = std::min(n, s + 64);
        v1::ClassifyRequest req;
        req.set_top_k(1);
        for (int64_t i = s; i < e; ++i)
          *req.add_images() = server::EncodeRawImage(test.images[i].permute({1, 2, 0}));
        grpc::ClientContext ctx;
        v1::ClassifyResponse r;
        const grpc::Status st = stub->Classify(&ctx, req, &r);
        ASSERT_TRUE(st.ok()) << st.error_message();
        ASSERT_EQ(r.results_size(), e - s);
        for (int64_t i = s; i < e; ++i) served[i] = r.results(i - s).top(0).index();
      }
    });
  }
  for (auto& t : clients) t.join();
  (*server)->Shutdown();

  KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel m, LoadModel(checkpoint));
  at::NoGradGuard no_grad;
  int64_t direct_correct = 0, served_correct = 0, disagree = 0;
  for (int64_t s = 0; s < n; s += 500) {
    const int64_t b = std::min<int64_t>(500, n - s);
    const at::Tensor pred =
        m.vit->Forward(NormalizePixels(m.vit->config(), test.images.narrow(0, s, b))).argmax(1);
    for (int64_t i = 0; i < b; ++i) {
      const int64_t label = test.labels[s + i].item<int64_t>();
      const int64_t p = pred[i].item<int64_t>();
      direct_correct += p == label;
      served_correct += served[s + i] == label;
      disagree += served[s + i] != p;
    }
  }
  EXPECT_EQ(served_correct, direct_correct) << disagree << " predictions differ";
  std::printf("accuracy through the server %.4f, direct %.4f (%lld images)\n",
              double(served_correct) / n, double(direct_correct) / n, static_cast<long long>(n));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace krause::testing
