// krause-loadgen's krause.v1 driver (--protocol krause, loadgen_drivers.h): GetModel, Score and
// Classify as asynchronous unary calls, Generate as a stream read by a reactor that times the
// first message, the first pixels and the gaps between a running stream's chunks; with --resume,
// Generate through client::ResumingGenerate on a thread of its own.
#include <algorithm>
#include <thread>

#include "client/loadgen_drivers.h"
#include "client/resume.h"

namespace krause::loadgen {
namespace {

class KrauseDriver : public Driver {
 public:
  KrauseDriver(LoadGen* gen, std::vector<std::unique_ptr<v1::KrauseService::Stub>> stubs)
      : gen_(gen), stubs_(std::move(stubs)) {}

  void Issue(uint64_t n, bool classify, int k, bool measured, std::function<void()> done) override {
    auto& stub = *stubs_[n % stubs_.size()];
    const std::string& w = gen_->options().workload;
    if (w == "getmodel") {  // the RPC floor: a call that runs no model
      v1::GetModelRequest req;
      req.set_name(gen_->classify_model_name());
      gen_->Unary<v1::ModelInfo>("GetModel", std::move(req), 0, measured, std::move(done),
                                 [&stub](auto&&... a) { stub.async()->GetModel(a...); });
      return;
    }
    if (w == "score") {
      v1::ScoreRequest req;
      req.set_model(gen_->options().generate_model);
      for (int i = 0; i < k; ++i) *req.add_images() = gen_->image(n * k + i);
      gen_->Unary<v1::ScoreResponse>("Score", std::move(req), k, measured, std::move(done),
                                     [&stub](auto&&... a) { stub.async()->Score(a...); });
      return;
    }
    if (classify) {
      v1::ClassifyRequest req;
      req.set_model(gen_->options().classify_model);
      req.set_top_k(1);
      req.set_priority(static_cast<uint32_t>(gen_->options().priority));
      for (int i = 0; i < k; ++i) *req.add_images() = gen_->image(n * k + i);
      gen_->Unary<v1::ClassifyResponse>("Classify", std::move(req), k, measured, std::move(done),
                                        [&stub](auto&&... a) { stub.async()->Classify(a...); });
    } else {
      const v1::Image* prompt = w == "complete" ? &gen_->image(n) : nullptr;
      if (gen_->options().resume) {
        ResumedGenerate(stub, n, measured, prompt, std::move(done));
      } else {
        new GenerateCall(gen_, stub, n, measured, prompt, std::move(done));
      }
    }
  }

 private:
  // --resume: the call through client::ResumingGenerate, read on a thread of its own.
  void ResumedGenerate(v1::KrauseService::Stub& stub, uint64_t n, bool measured,
                       const v1::Image* prompt, std::function<void()> done) {
    std::thread([gen = gen_, &stub, measured, req = gen_->GenerateRequest(n, prompt),
                 done = std::move(done)] {
      krause::client::ResumeOptions ro;
      ro.deadline_seconds = gen->conn().timeout_seconds;
      const Clock::time_point start = Clock::now();
      krause::client::ResumingGenerate call(&stub, gen->conn(), req, ro);
      v1::GenerateResponse m;
      double first = -1, first_pixel = -1;
      while (call.Read(&m)) {
        if (first < 0) first = Seconds(Clock::now() - start);
        if (first_pixel < 0 && m.progress().pixels_done() > 0)
          first_pixel = Seconds(Clock::now() - start);
      }
      const grpc::Status st = call.Finish();
      const krause::client::ResumeStats rs = call.stats();
      gen->Record("Generate", measured, st, Seconds(Clock::now() - start),
                  st.ok() ? req.num_images() : 0);
      if (measured) {
        Stats& s = gen->stats();
        std::lock_guard<std::mutex> l(s.mu);
        s.resumed_streams += static_cast<int64_t>(rs.breaks.size());
        s.resume_calls += rs.resumed_calls;
        s.rows_recomputed += rs.rows_recomputed;
        if (st.ok() && first >= 0) s.first_chunk.push_back(first);
        if (st.ok() && first_pixel >= 0) s.first_pixel.push_back(first_pixel);
      }
      gen->Ended(done);
    }).detach();
  }

  class GenerateCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    GenerateCall(LoadGen* g, v1::KrauseService::Stub& stub, uint64_t n, bool measured,
                 const v1::Image* prompt, std::function<void()> done)
        : g_(g), measured_(measured), done_(std::move(done)) {
      krause::client::PrepareContext(g->conn(), &ctx_);
      req_ = g->GenerateRequest(n, prompt);
      start_ = last_ = Clock::now();
      stub.async()->Generate(&ctx_, &req_, this);
      StartRead(&msg_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      const Clock::time_point now = Clock::now();
      if (chunks_++ == 0) first_ = Seconds(now - start_);
      // Gaps between the chunks of a running stream: from the first message with pixels on
      // (before it, the images wait for a cache slot; that wait is the first pixel's time).
      const bool has_pixels = msg_.progress().pixels_done() > 0 || msg_.images_size() > 0;
      if (running_) {
        gaps_.push_back(Seconds(now - last_));
      } else if (has_pixels) {
        running_ = true;
        first_pixel_ = Seconds(now - start_);
      }
      last_ = now;
      StartRead(&msg_);
    }
    void OnDone(const grpc::Status& st) override {
      g_->Record("Generate", measured_, st, Seconds(Clock::now() - start_),
                 st.ok() ? req_.num_images() : 0);
      if (measured_ && st.ok()) {
        Stats& s = g_->stats();
        std::lock_guard<std::mutex> l(s.mu);
        if (chunks_ > 0) s.first_chunk.push_back(first_);
        if (running_) s.first_pixel.push_back(first_pixel_);
        s.chunk_gap.insert(s.chunk_gap.end(), gaps_.begin(), gaps_.end());
      }
      LoadGen* g = g_;
      auto done = std::move(done_);
      delete this;
      g->Ended(done);
    }

   private:
    LoadGen* g_;
    bool measured_;
    std::function<void()> done_;
    grpc::ClientContext ctx_;
    v1::GenerateRequest req_;
    v1::GenerateResponse msg_;
    Clock::time_point start_, last_;
    double first_ = 0, first_pixel_ = 0;
    int chunks_ = 0;
    bool running_ = false;
    std::vector<double> gaps_;
  };

  LoadGen* gen_;
  std::vector<std::unique_ptr<v1::KrauseService::Stub>> stubs_;
};

}  // namespace

std::unique_ptr<Driver> MakeKrauseDriver(
    LoadGen* gen, std::vector<std::unique_ptr<v1::KrauseService::Stub>> stubs) {
  return std::make_unique<KrauseDriver>(gen, std::move(stubs));
}

}  // namespace krause::loadgen
