// Chaos across replicas: three krause-server processes on loopback (the bundled models), one
// client target over all three (round robin), and a replica stopped in the middle of the load.
//
//   KillNineMidStream   16 concurrent 8-image Generates (guided, completions, plain, top-k);
//                       once every stream has rows, the replica holding the most cache slots
//                       is killed with SIGKILL. Every image completes through the resuming
//                       client and is byte-identical to an undisturbed run; the survivors' KV
//                       gauges return to 0.
//   SigtermShortDrain   the same with SIGTERM and a 0.2 s drain (a rolling update): the
//                       streams still running when the drain ends are cancelled with DRAINING
//                       and resumed elsewhere at once.
//   ClassifyLoadSurvivesAKill  4 threads of Classify calls across the three with the retry
//                       policy; one replica is killed with SIGKILL; no call fails.
//
// Each reports images completed, rows recomputed and the extra time over the undisturbed run.
// KRAUSE_CHAOS_RESUME=0 runs the Generate cases with resuming off (they then fail: that is how
// the resume is shown to be what saves the streams).
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/connection.h"
#include "client/http_get.h"
#include "client/resume.h"
#include "krause/v1/krause.grpc.pb.h"

namespace krause::testing {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

template <typename F>
bool Eventually(F done, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// gRPC 1.51 (Debian 12) runs the callback API on one shared completion queue, created by the
// first callback call and torn down when the last channel that used it goes. Tearing it down and
// creating it again in one process double-frees it now and then (ASan here: "attempting
// double-free" in grpc_cq_internal_unref on its polling thread, in about 1 run of 10 of the
// Generate cases, which make a channel per load). A channel kept for the whole process, after one
// callback call, keeps that queue alive: one queue per process, as in krause-client and
// krause-loadgen.
void PinCallbackQueue() {
  static const bool pinned = [] {
    auto* channel = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
    auto stub = v1::KrauseService::NewStub(*channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ListModelsRequest req;
    v1::ListModelsResponse resp;
    std::promise<void> done;
    stub->async()->ListModels(&ctx, &req, &resp, [&](grpc::Status) { done.set_value(); });
    done.get_future().wait();
    return true;
  }();
  (void)pinned;
}

struct Replica {
  pid_t pid = -1;
  int port = 0, metrics_port = 0;
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
  std::string metrics() const { return absl::StrCat("127.0.0.1:", metrics_port); }
};

class Cluster {
 public:
  explicit Cluster(double drain_seconds) {
    PinCallbackQueue();
    dir_ = "/tmp/krause-chaos-XXXXXX";
    if (mkdtemp(dir_.data()) == nullptr) return;
    const std::string models = std::string(KRAUSE_SOURCE_DIR) + "/models";
    manifest_ = dir_ + "/manifest.json";
    std::ofstream(manifest_) << R"({"models": [
      {"name": "krause-vit-fmnist", "checkpoint": ")"
                             << models << R"(/krause_vit_fmnist.safetensors", "default": true},
      {"name": "karm-fmnist", "checkpoint": ")"
                             << models << R"(/karm_fmnist.safetensors", "default": true,
       "max_sequences": 96, "max_waiting": 256, "max_images_per_request": 8}]})";
    for (int i = 0; i < 3; ++i) replicas_.push_back(Start(i, drain_seconds));
  }
  ~Cluster() {
    for (Replica& r : replicas_) {
      if (r.pid <= 0) continue;
      kill(r.pid, SIGKILL);
      waitpid(r.pid, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  bool ok() const {
    for (const Replica& r : replicas_)
      if (r.port <= 0) return false;
    return !replicas_.empty();
  }
  std::string target() const {
    std::string t = "ipv4:";
    for (size_t i = 0; i < replicas_.size(); ++i)
      absl::StrAppend(&t, i ? "," : "", replicas_[i].address());
    return t;
  }
  const std::vector<Replica>& replicas() const { return replicas_; }

  // A replica's gauge (summed over its label sets); -1 when it cannot be scraped.
  double Gauge(int i, const std::string& name) const {
    auto text = client::HttpGet(replicas_[i].metrics(), "/metrics", 2);
    if (!text.ok()) return -1;
    return client::PrometheusSum(*text, name);
  }

  // Sends `sig` to replica i; with SIGKILL it is reaped at once, with SIGTERM waited for.
  void Stop(int i, int sig) {
    Replica& r = replicas_[i];
    kill(r.pid, sig);
    waitpid(r.pid, nullptr, 0);
    r.pid = -1;
  }

 private:
  Replica Start(int i, double drain_seconds) {
    Replica r;
    r.metrics_port = FreePort();
    const std::string port_file = absl::StrCat(dir_, "/port-", i);
    r.pid = fork();
    if (r.pid == 0) {
      const std::string server = std::string(KRAUSE_BIN_DIR) + "/krause-server";
      const std::string manifest = "--manifest=" + manifest_;
      const std::string pf = "--port_file=" + port_file;
      const std::string metrics = absl::StrCat("--metrics_listen=", r.metrics());
      const std::string drain = absl::StrCat("--drain_seconds=", drain_seconds);
      const std::string log = absl::StrCat(dir_, "/server-", i, ".log");
      if (freopen(log.c_str(), "w", stderr) == nullptr) _exit(126);
      execl(server.c_str(), "krause-server", manifest.c_str(), "--listen=127.0.0.1:0", pf.c_str(),
            metrics.c_str(), drain.c_str(), "--threads=1",
            "--http_listen=", static_cast<char*>(nullptr));
      _exit(127);
    }
    const bool up = Eventually([&] {
      std::ifstream in(port_file);
      return static_cast<bool>(in >> r.port) || waitpid(r.pid, nullptr, WNOHANG) != 0;
    });
    if (!up) r.port = 0;
    return r;
  }

  std::string dir_, manifest_;
  std::vector<Replica> replicas_;
};

// The 16 calls: guided, completions, plain conditional with a lower temperature and top_p,
// unconditional with top-k; seed 1000 * i (image j: 1000 * i + j).
v1::GenerateRequest Call(int i) {
  v1::GenerateRequest r;
  r.set_model("karm-fmnist");
  r.set_num_images(8);
  r.set_seed(1000 * i);
  r.set_update_interval_ms(20);
  switch (i % 4) {
    case 0:
      r.set_class_index(i % 10);
      r.set_guidance(2);
      break;
    case 1: {
      v1::RawImage* p = r.mutable_prompt()->mutable_raw();
      p->set_height(10);
      p->set_width(28);
      p->set_channels(1);
      std::string px(280, 0);
      for (int k = 0; k < 280; ++k) px[k] = static_cast<char>((k * 37 + i * 11) % 256);
      p->set_pixels(px);
      r.set_prompt_rows(10);
      break;
    }
    case 2:
      r.set_class_index(i % 10);
      r.set_temperature(0.8f);
      r.set_top_p(0.9f);
      break;
    default:
      r.set_top_k(20);
      break;
  }
  return r;
}

struct Outcome {
  grpc::Status status;
  std::vector<std::string> png = std::vector<std::string>(8);
  std::vector<std::string> rows = std::vector<std::string>(8);
  client::ResumeStats stats;
};

struct Run {
  std::vector<Outcome> calls;
  double seconds = 0;
  int images = 0;
  int64_t resumed = 0, resume_calls = 0, rows_recomputed = 0, failed = 0;
};

bool ResumeOn() {
  const char* e = std::getenv("KRAUSE_CHAOS_RESUME");
  return e == nullptr || std::string(e) != "0";
}

// Runs the 16 calls concurrently through the resuming client. `started` counts the calls that
// have received rows; `chaos` runs on this thread once all 16 have (or after a minute).
template <typename Chaos>
Run RunLoad(const std::string& target, bool resume, Chaos chaos) {
  client::ConnectionOptions conn;
  conn.server = target;
  conn.retry = true;
  auto channel = client::MakeChannel(conn);
  EXPECT_TRUE(channel.ok());
  auto stub = v1::KrauseService::NewStub(*channel);
  Run run;
  run.calls.resize(16);
  std::atomic<int> started{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      client::ResumeOptions o;
      o.resume = resume;
      o.deadline_seconds = 300;
      client::ResumingGenerate g(stub.get(), conn, Call(i), o);
      v1::GenerateResponse m;
      Outcome& out = run.calls[i];
      bool counted = false;
      while (g.Read(&m)) {
        for (const auto& r : m.rows()) out.rows[r.image()] += r.pixels();
        for (const auto& im : m.images()) out.png[im.image()] = im.png();
        if (!counted && m.rows_size() > 0) {
          counted = true;
          started.fetch_add(1);
        }
      }
      out.status = g.Finish();
      out.stats = g.stats();
      if (!counted) started.fetch_add(1);  // ended before any row: do not hold the chaos
    });
  }
  EXPECT_TRUE(Eventually([&] { return started.load() == 16; }));
  chaos();
  for (auto& t : threads) t.join();
  run.seconds = Seconds(Clock::now() - t0);
  for (const Outcome& o : run.calls) {
    if (!o.status.ok()) ++run.failed;
    for (const auto& p : o.png) run.images += p.empty() ? 0 : 1;
    run.resumed += static_cast<int64_t>(o.stats.breaks.size());
    run.resume_calls += o.stats.resumed_calls;
    run.rows_recomputed += o.stats.rows_recomputed;
  }
  return run;
}

// The replica holding the most cache slots now.
int Busiest(const Cluster& c) {
  int best = 0;
  double most = -1;
  for (int i = 0; i < 3; ++i) {
    const double v = c.Gauge(i, "krause_kv_cache_slots_in_use");
    if (v > most) {
      most = v;
      best = i;
    }
  }
  return best;
}

void ChaosGenerate(int sig, double drain_seconds, const char* what) {
  Cluster cluster(drain_seconds);
  ASSERT_TRUE(cluster.ok()) << "the replicas did not start";
  // The undisturbed run, twice: the first warms the connections and the replicas (the second's
  // time is the baseline), and both give the same images, which every later run must reproduce.
  const Run cold = RunLoad(cluster.target(), true, [] {});
  const Run calm = RunLoad(cluster.target(), true, [] {});
  ASSERT_EQ(calm.failed, 0);
  ASSERT_EQ(calm.images, 128);
  ASSERT_EQ(calm.resumed, 0);
  for (int i = 0; i < 16; ++i) ASSERT_EQ(cold.calls[i].png, calm.calls[i].png) << i;

  const bool resume = ResumeOn();
  int victim = -1;
  double victim_slots = 0;
  const Run chaos = RunLoad(cluster.target(), resume, [&] {
    victim = Busiest(cluster);
    victim_slots = cluster.Gauge(victim, "krause_kv_cache_slots_in_use");
    cluster.Stop(victim, sig);
  });
  std::printf(
      "chaos (%s of the replica holding %.0f cache slots, resume %s): %d/128 images completed, "
      "%lld call(s) failed; %lld stream(s) broke and were resumed on %lld call(s); %lld row(s) "
      "recomputed; %.2f s against %.2f s undisturbed (extra %.2f s)\n",
      what, victim_slots, resume ? "on" : "off", chaos.images, static_cast<long long>(chaos.failed),
      static_cast<long long>(chaos.resumed), static_cast<long long>(chaos.resume_calls),
      static_cast<long long>(chaos.rows_recomputed), chaos.seconds, calm.seconds,
      chaos.seconds - calm.seconds);
  for (const Outcome& o : chaos.calls)
    for (const std::string& b : o.stats.breaks) std::printf("  break: %s\n", b.c_str());
  // The stop hit streams in the middle (else this run proves nothing).
  EXPECT_GT(victim_slots, 0);
  EXPECT_GT(chaos.resumed, 0);
  EXPECT_EQ(chaos.failed, 0);
  EXPECT_EQ(chaos.images, 128);
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(chaos.calls[i].status.ok()) << i << ": " << chaos.calls[i].status.error_message();
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(chaos.calls[i].png[j], calm.calls[i].png[j]) << "call " << i << " image " << j;
      EXPECT_EQ(chaos.calls[i].rows[j], calm.calls[i].rows[j]) << "call " << i << " image " << j;
    }
  }
  // The survivors hold no cache slot once the streams are over.
  for (int i = 0; i < 3; ++i) {
    if (i == victim) continue;
    EXPECT_TRUE(Eventually([&] { return cluster.Gauge(i, "krause_kv_cache_slots_in_use") == 0; },
                           std::chrono::seconds(10)))
        << "replica " << i;
  }
}

TEST(Chaos, KillNineMidStream) { ChaosGenerate(SIGKILL, 2, "kill -9"); }

TEST(Chaos, SigtermShortDrain) { ChaosGenerate(SIGTERM, 0.2, "SIGTERM, 0.2 s drain"); }

TEST(Chaos, ClassifyLoadSurvivesAKill) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ok()) << "the replicas did not start";
  client::ConnectionOptions conn;
  conn.server = cluster.target();
  conn.retry = true;
  auto channel = client::MakeChannel(conn);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::KrauseService::NewStub(*channel);
  std::atomic<int> calls{0}, failed{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; !stop.load(); ++n) {
        v1::ClassifyRequest req;
        req.set_model("krause-vit-fmnist");
        for (int k = 0; k < 4; ++k) {
          v1::RawImage* im = req.add_images()->mutable_raw();
          im->set_height(28);
          im->set_width(28);
          im->set_channels(1);
          im->set_pixels(std::string(784, static_cast<char>((t * 31 + n * 7 + k) % 256)));
        }
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        v1::ClassifyResponse r;
        const grpc::Status st = stub->Classify(&ctx, req, &r);
        calls.fetch_add(1);
        if (!st.ok()) {
          failed.fetch_add(1);
          std::lock_guard<std::mutex> l(mu);
          errors.push_back(st.error_message());
        }
      }
    });
  }
  ASSERT_TRUE(Eventually([&] { return calls.load() >= 100; }));
  const int before = calls.load();
  cluster.Stop(0, SIGKILL);
  ASSERT_TRUE(Eventually([&] { return calls.load() >= before + 200; }));
  stop = true;
  for (auto& t : threads) t.join();
  std::printf("chaos (Classify, kill -9 of one replica after %d calls): %d calls, %d failed\n",
              before, calls.load(), failed.load());
  EXPECT_EQ(failed.load(), 0) << (errors.empty() ? "" : errors.front());
}

}  // namespace
}  // namespace krause::testing
