// The krause-server and krause-client binaries as users run them: the server as a child process
// (manifest, --port_file), a client session (list, health, classify, generate, complete, score,
// errors and exit codes), and SIGTERM ending the server with exit code 0.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "model/data/png.h"
#include "server_fixture.h"

namespace krause::testing {
namespace {

struct ShellRun {
  int code = -1;
  std::string out;  // stdout and stderr together
};

ShellRun Shell(const std::string& cmd) {
  ShellRun r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class ServerBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    models_ = WriteTinyModels("bin");
    const std::string port_file = models_.dir + "/port";
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      const std::string server = std::string(KRAUSE_BIN_DIR) + "/krause-server";
      const std::string manifest = "--manifest=" + models_.manifest;
      const std::string pf = "--port_file=" + port_file;
      execl(server.c_str(), "krause-server", manifest.c_str(), "--listen=127.0.0.1:0", pf.c_str(),
            "--threads=1", "--drain_seconds=2", "--metrics_listen=127.0.0.1:0",
            "--http_listen=", static_cast<char*>(nullptr));
      _exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      std::ifstream in(port_file);
      if (in >> port_) break;
      int status;
      ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << "krause-server exited early";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GT(port_, 0) << "krause-server did not write its port";
    client_ = std::string(KRAUSE_BIN_DIR) +
              "/krause-client --server=127.0.0.1:" + std::to_string(port_) + " ";
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove_all(models_.dir);
  }

  TinyModels models_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string client_;
};

// Writes an IDX file of unsigned bytes with the given dimensions and values i % mod.
void WriteIdxBytes(const std::string& path, const std::vector<int>& dims, int mod) {
  std::ofstream f(path, std::ios::binary);
  const unsigned char head[] = {0, 0, 8, static_cast<unsigned char>(dims.size())};
  f.write(reinterpret_cast<const char*>(head), sizeof(head));
  int64_t count = 1;
  for (int d : dims) {
    const unsigned char be[] = {0, 0, static_cast<unsigned char>(d >> 8),
                                static_cast<unsigned char>(d & 255)};
    f.write(reinterpret_cast<const char*>(be), 4);
    count *= d;
  }
  for (int64_t i = 0; i < count; ++i) f.put(static_cast<char>(i * 7 % mod));
}

TEST_F(ServerBinaryTest, ClassesFromTheClientAndScoreSplitIntoCallsTheModelAccepts) {
  const std::string out = models_.dir + "/cond";
  ShellRun r = Shell(client_ +
                     "generate --model karm-cond --label one --num 2 --seed 3 "
                     "--progress=false --out " +
                     out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(ReadPng(out + "/sample-1.png").ok());
  r = Shell(client_ +
            "generate --model karm-cond --class_index 1 --num 2 --seed 3 --prefix idx "
            "--progress=false --out " +
            out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(
      at::equal(ReadPng(out + "/sample-1.png").value(), ReadPng(out + "/idx-1.png").value()));
  // Guided: other images than the unguided ones of the same seeds; without a class refused.
  r = Shell(client_ +
            "generate --model karm-cond --label one --guidance 3 --num 2 --seed 3 --prefix g "
            "--progress=false --out " +
            out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(
      at::equal(ReadPng(out + "/sample-1.png").value(), ReadPng(out + "/g-1.png").value()));
  r = Shell(client_ + "generate --model karm-cond --guidance 3 --progress=false --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("guidance 3 needs a class"));
  r = Shell(client_ + "generate --model karm-cond --label three --progress=false --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("valid labels: zero, one, two"));
  r = Shell(client_ + "generate --label one --class_index 1 --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("not both"));

  // 17 images for karm (at most 8 per request): three calls, one mean.
  const std::string images = models_.dir + "/imgs17.idx", labels = models_.dir + "/labels17.idx";
  WriteIdxBytes(images, {17, 6, 6}, 256);
  WriteIdxBytes(labels, {17}, 3);
  r = Shell(client_ + "score --model karm " + images);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("over 17 image(s) in 3 call(s)"));
  r = Shell(client_ + "score --model karm-cond --index 2:13 --labels_file " + labels + " " +
            images);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("over 11 image(s) in 2 call(s), given the classes"));
  r = Shell(client_ + "score --model karm --label zero " + images);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("unconditional"));
}

// krause-client inspect: heatmaps (one PNG per query: the image and one tile per head, per layer),
// the summary table, the raw reply, and the server's field errors.
TEST_F(ServerBinaryTest, InspectDrawsHeatmapsAndPrintsTheFigures) {
  const std::string images = models_.dir + "/imgs.idx", out = models_.dir + "/heat";
  WriteIdxBytes(images, {3, 8, 8}, 256);
  // The ViT (8x8, patches of 4: a 2x2 grid and CLS): the centre token (row 1, column 1) is 4.
  ShellRun r = Shell(client_ + "inspect --index 1 --out " + out + " " + images);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("inspect-q4.png: query 4 (row 1, column 1)"));
  auto png = ReadPng(out + "/inspect-q4.png");
  ASSERT_TRUE(png.ok()) << png.status();
  // 1 layer, 2 heads: tiles of the 8x8 image scaled by 24 (192 px), 3 columns, 4-px gaps.
  EXPECT_EQ(png->size(0), 4 + 192 + 4);
  EXPECT_EQ(png->size(1), 3 * (192 + 4) + 4);
  EXPECT_EQ(png->size(2), 3);
  r = Shell(client_ + "inspect --index 1 --query 0,2 --out " + out + " " + images);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(ReadPng(out + "/inspect-q0.png").ok());
  EXPECT_TRUE(ReadPng(out + "/inspect-q2.png").ok());
  r = Shell(client_ + "inspect --index 1 --summary " + images);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("vit (version 1, Krause attention on fused_cpu)"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("busiest_key_share"));
  // A generator, by class, as JSON.
  const std::string pixels = models_.dir + "/px.idx";
  WriteIdxBytes(pixels, {1, 6, 6}, 256);
  r = Shell(client_ + "inspect --model karm-cond --label two --query 35 --json " + pixels);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("\"kind\": \"GENERATOR\""));
  EXPECT_THAT(r.out, ::testing::HasSubstr("\"query\": 35"));
  // The server's errors, with the field.
  r = Shell(client_ + "inspect --index 1 --layer 3 " + images);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("layers[0] = 3 is out of range"));
  r = Shell(client_ + "inspect --index 1 --query x " + images);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("--query x: need indices >= 0"));
}

TEST_F(ServerBinaryTest, ClientSessionAndSigtermExitsZero) {
  ShellRun r = Shell(client_ + "list");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("karm-big"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("GENERATOR"));
  r = Shell(client_ + "list --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("\"name\": \"vit\""));
  r = Shell(client_ + "health");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, ::testing::HasSubstr("SERVING"));

  // classify a PNG and an IDX slice
  at::Generator gen = at::detail::createCPUGenerator(3);
  const at::Tensor img = at::randint(0, 256, {8, 8, 1}, gen, at::kLong).to(at::kByte);
  const std::string png = models_.dir + "/in.png";
  ASSERT_TRUE(WritePng(png, img).ok());
  r = Shell(client_ + "classify --top 2 " + png);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("in.png:"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("FLOPs:"));
  {
    // a 3-image IDX file (magic 0x00000803, dims 3 x 8 x 8)
    std::ofstream f(models_.dir + "/imgs.idx", std::ios::binary);
    const unsigned char head[] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 8, 0, 0, 0, 8};
    f.write(reinterpret_cast<const char*>(head), sizeof(head));
    for (int i = 0; i < 3 * 64; ++i) f.put(static_cast<char>(i));
  }
  r = Shell(client_ + "classify --json --index 1:3 " + models_.dir + "/imgs.idx");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("imgs.idx[1]"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("imgs.idx[2]"));
  EXPECT_THAT(r.out, ::testing::Not(::testing::HasSubstr("imgs.idx[0]")));

  // generate and complete write PNGs of the model's shape
  const std::string out = models_.dir + "/out";
  r = Shell(client_ + "generate --num 2 --seed 5 --progress=false --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  for (int i = 0; i < 2; ++i) {
    auto t = ReadPng(out + "/sample-" + std::to_string(i) + ".png");
    ASSERT_TRUE(t.ok()) << r.out;
    EXPECT_EQ(t->sizes(), at::IntArrayRef({6, 6, 1}));
  }
  EXPECT_THAT(r.out, ::testing::HasSubstr("seed 5"));
  const std::string prompt = models_.dir + "/prompt.png";
  const at::Tensor p = at::randint(0, 256, {6, 6, 1}, gen, at::kLong).to(at::kByte);
  ASSERT_TRUE(WritePng(prompt, p).ok());
  r = Shell(client_ + "complete --model arm --rows 3 --prefix done --progress=false --out " + out +
            " " + prompt);
  ASSERT_EQ(r.code, 0) << r.out;
  auto done = ReadPng(out + "/done-0.png");
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(at::equal(done->narrow(0, 0, 3), p.narrow(0, 0, 3)));

  // score
  r = Shell(client_ + "score --json " + out + "/sample-0.png " + out + "/sample-1.png");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("mean_bits_per_dim"));

  // errors: a clear message and exit code 1; bad usage exit code 2
  r = Shell(client_ + "classify --model nope " + png);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("NOT_FOUND"));
  r = Shell(client_ + "classify --model karm " + png);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("FAILED_PRECONDITION"));
  r = Shell(client_ + "frobnicate");
  EXPECT_EQ(r.code, 2);
  r = Shell(std::string(KRAUSE_BIN_DIR) + "/krause-client --server=127.0.0.1:1 --timeout=2 list");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("UNAVAILABLE"));

  // SIGTERM: drain and exit 0
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid_, &status, 0), pid_);
  pid_ = -1;
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace krause::testing

namespace krause::testing {
namespace {

// krause-loadgen against an in-process server on the tiny models.
class LoadGen : public ::testing::Test {
 protected:
  void Start(const std::string& name, const std::function<void(server::ServerOptions&)>& set) {
    models_ = WriteTinyModels(name, 5, 64);
    server::ServerOptions o = LoopbackOptions(models_.manifest);
    set(o);
    auto s = server::KrauseServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::filesystem::remove_all(models_.dir);
  }
  // krause-loadgen with `args` (synthetic data, no warm-up): its exit code and JSON report.
  static std::pair<int, nlohmann::json> Run(const std::string& args) {
    const ShellRun r = Shell(std::string(KRAUSE_BIN_DIR) +
                             "/krause-loadgen --progress=false --data=synthetic --warmup=0 "
                             "--json=- " +
                             args);
    const size_t brace = r.out.find("{\n");
    EXPECT_NE(brace, std::string::npos) << r.out;
    if (brace == std::string::npos) return {r.code, nlohmann::json()};
    return {r.code, nlohmann::json::parse(r.out.substr(brace))};
  }

  TinyModels models_;
  std::unique_ptr<server::KrauseServer> server_;
};

// Closed and open loop: the JSON report counts exactly the calls it was asked for, and the
// server's view comes from /metrics.
TEST_F(LoadGen, ClosedAndOpenLoopReports) {
  Start("loadgen", [](server::ServerOptions& o) { o.metrics_listen = "127.0.0.1:0"; });
  const std::string base = "--server=127.0.0.1:" + std::to_string(server_->port()) +
                           " --metrics=127.0.0.1:" + std::to_string(server_->metrics_port()) + " ";
  // Closed loop over the tiny KARM.
  auto [code, j] =
      Run(base + "--workload=generate --concurrency=8 --requests=24 --generate_model=karm");
  ASSERT_EQ(code, 0) << j;
  EXPECT_EQ(j["calls"], 24);
  EXPECT_EQ(j["errors_by_code"]["Generate"]["OK"], 24);
  EXPECT_EQ(j["latency_seconds"]["Generate"]["count"], 24);
  EXPECT_GT(j["generate_first_chunk_seconds"]["count"].get<int>(), 0);
  EXPECT_EQ(j["server"]["generated_pixels"], 24 * 36);
  // The server's view is there (whether calls overlapped in a step depends on the machine: a
  // tiny image takes about a millisecond).
  EXPECT_GE(j["server"]["decode_mean_batch_sequences"].get<double>(), 1.0);
  EXPECT_GT(j["server"]["decode_steps"].get<double>(), 0.0);
  EXPECT_GT(j["server"]["flop_saving"].get<double>(), 0.0);

  // Open loop; synthetic images take the classifier's shape (8x8, from ListModels): every call
  // succeeds.
  std::tie(code, j) =
      Run(base + "--mode=open --rate=200 --arrivals=constant --requests=10 --workload=classify");
  EXPECT_EQ(code, 0) << j;
  EXPECT_EQ(j["errors_by_code"]["Classify"]["OK"], 10);
  // The 28x28 Fashion-MNIST images do not fit it: every call fails with INVALID_ARGUMENT,
  // counted by code, and the exit code says so.
  std::tie(code, j) = Run(base +
                          "--data=fashion-mnist --mode=open --rate=200 --arrivals=constant "
                          "--requests=10 --workload=classify");
  EXPECT_EQ(code, 3) << j;
  EXPECT_EQ(j["errors_by_code"]["Classify"]["INVALID_ARGUMENT"], 10);
}

// --tenants: several tenants in one process, each with its token, concurrency and workload,
// reported apart; a tenant asking a priority its token is not allowed gets only
// PERMISSION_DENIED, and the others none.
TEST_F(LoadGen, TenantsAreLoadedAndReportedApart) {
  Start("loadgen-tenants", [](server::ServerOptions& o) {
    o.auth_tokens_file = o.manifest + ".tokens";
    std::ofstream(o.auth_tokens_file) << "tok-a tenant=a\ntok-b tenant=b weight=3\n";
  });
  const std::string base = "--server=127.0.0.1:" + std::to_string(server_->port()) +
                           " --classify_model=vit --generate_model=karm --duration=1 ";
  auto [code, j] =
      Run(base + "--tenants=A:tok-a:4:classify:2,B:tok-b:2:generate:1:1,C:tok-a:1:classify:1:2");
  EXPECT_EQ(code, 3) << j;  // C's calls failed
  ASSERT_TRUE(j.contains("tenants")) << j;
  const nlohmann::json& t = j["tenants"];
  EXPECT_EQ(t["A"]["workload"], "classify");
  EXPECT_GT(t["A"]["errors_by_code"]["Classify"]["OK"].get<int>(), 0);
  EXPECT_EQ(t["A"]["errors_by_code"]["Classify"].size(), 1u) << t["A"];
  EXPECT_NEAR(t["A"]["images_per_second"].get<double>(),
              2 * t["A"]["calls"].get<double>() / t["A"]["measured_seconds"].get<double>(), 1e-6);
  EXPECT_GT(t["B"]["errors_by_code"]["Generate"]["OK"].get<int>(), 0);
  EXPECT_EQ(t["B"]["errors_by_code"]["Generate"].size(), 1u) << t["B"];
  EXPECT_GT(t["C"]["errors_by_code"]["Classify"]["PERMISSION_DENIED"].get<int>(), 0);
  EXPECT_EQ(t["C"]["errors_by_code"]["Classify"].size(), 1u) << t["C"];
  // A spec that is not NAME:TOKEN:CONCURRENCY[...] is refused before any call.
  const ShellRun bad =
      Shell(std::string(KRAUSE_BIN_DIR) + "/krause-loadgen " + base + "--tenants=A:tok-a");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("is not NAME:TOKEN:CONCURRENCY"), std::string::npos) << bad.out;
}

// --protocol http: streamed generations through generate_stream, counted with the stream's
// figures; a classify whose images do not fit is counted by the code its HTTP status means.
TEST_F(LoadGen, HttpProtocolReports) {
  Start("loadgen-http", [](server::ServerOptions& o) { o.http_listen = "127.0.0.1:0"; });
  const std::string base =
      "--protocol=http --http_server=127.0.0.1:" + std::to_string(server_->http_port()) +
      " --classify_model=vit ";
  auto [code, j] = Run(base +
                       "--workload=generate --concurrency=8 --requests=24 --generate_model=karm "
                       "--generate_images=2");
  ASSERT_EQ(code, 0) << j;
  EXPECT_EQ(j["calls"], 24);
  EXPECT_EQ(j["errors_by_code"]["Generate"]["OK"], 24);
  EXPECT_EQ(j["generate_first_pixel_seconds"]["count"], 24);
  EXPECT_GT(j["images_per_second"].get<double>(), 0.0);
  EXPECT_EQ(j["config"]["protocol"], "http");
  // The 28x28 Fashion-MNIST images do not fit the 8x8 classifier.
  std::tie(code, j) =
      Run(base + "--data=fashion-mnist --workload=classify --concurrency=4 --requests=8");
  EXPECT_EQ(code, 3) << j;
  EXPECT_EQ(j["errors_by_code"]["ModelInfer"]["INVALID_ARGUMENT"], 8);
  ASSERT_FALSE(j["error_samples"].empty());
  EXPECT_NE(j["error_samples"][0].get<std::string>().find("image"), std::string::npos);
  // The same with binary tensors: the body is read (the error is the images' shape, not the
  // layout).
  std::tie(code, j) = Run(base +
                          "--data=fashion-mnist --workload=classify --concurrency=4 --requests=8 "
                          "--http_binary");
  EXPECT_EQ(code, 3) << j;
  EXPECT_EQ(j["errors_by_code"]["ModelInfer"]["INVALID_ARGUMENT"], 8);
  EXPECT_NE(j["error_samples"][0].get<std::string>().find("shape [1, 28, 28, 1]"),
            std::string::npos)
      << j["error_samples"];
}

}  // namespace
}  // namespace krause::testing
