// The decode engine tests' shared parts (decode_engine_test.cc, decode_engine_conditional_test.cc,
// decode_engine_resume_test.cc): a tiny pixel model's config, a generation request, and the
// router that drives an engine and collects each request's outcome, as the server's worker does.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/engine/decode_engine.h"

namespace krause {

inline PixelModelConfig TinyConfig(const std::string& attention, bool start) {
  PixelModelConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.height = 4;
  c.width_px = 5;
  c.channels = 1;  // 20 subpixels
  c.d_model = 32;
  c.depth = 2;
  c.heads = 4;
  c.window = 6;
  c.top_k = 4;
  c.start_token = start;
  return c;
}

struct Outcome {
  absl::Status status;
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> streamed;
  int done_calls = 0;
};

inline GenerationRequest Request(uint64_t seed, std::vector<uint8_t> prompt = {}) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.seed = seed;
  r.sampling.temperature = 1.0;
  r.sampling.top_p = 0.95;
  return r;
}

// Drives an engine and hands each step's output to the Outcome of its request, by id (what the
// server's worker does for its calls).
class Router {
 public:
  explicit Router(DecodeEngine* engine) : engine_(engine) {}
  absl::StatusOr<int64_t> Submit(GenerationRequest r, Outcome* out) {
    const int64_t offset = static_cast<int64_t>(r.prompt.size());
    auto id = engine_->Submit(std::move(r));
    if (id.ok()) routes_[*id] = {out, offset};
    return id;
  }
  StepStats Step() {
    const StepOutput o = engine_->Step();
    for (const StepOutput::Pixel& p : o.pixels) {
      const Route& r = routes_.at(p.id);
      // In order, right after the prompt (x_0 of a start-less model without prompt is index 0).
      EXPECT_EQ(p.index, r.offset + static_cast<int64_t>(r.out->streamed.size()));
      r.out->streamed.push_back(p.value);
    }
    for (const StepOutput::Finished& f : o.finished) {
      Outcome* out = routes_.at(f.id).out;
      out->status = f.status;
      out->pixels = f.image;
      ++out->done_calls;
      if (f.status.ok()) {
        EXPECT_EQ(f.sampled, static_cast<int64_t>(f.image.size()) - routes_.at(f.id).offset);
      }
    }
    return o.stats;
  }
  void Drain() {
    while (engine_->Busy()) Step();
  }

 private:
  struct Route {
    Outcome* out;
    int64_t offset;  // prompt length
  };
  DecodeEngine* engine_;
  std::map<int64_t, Route> routes_;
};

// Generates `count` images with seeds 0..count-1; request i is submitted at step i * stagger,
// with class label_of(i) when given (and then `guidance` for the images with a class).
inline std::vector<Outcome> Generate(const PixelModel& m, int64_t slots, int64_t count,
                                     int64_t stagger,
                                     const std::function<int64_t(int64_t)>& label_of = nullptr,
                                     double guidance = 1.0, at::ScalarType cache_dtype = at::kFloat,
                                     Precision precision = Precision::kFp32) {
  EngineOptions options{slots, 0};
  options.cache_dtype = cache_dtype;
  options.precision = precision;
  auto engine = DecodeEngine::Create(&m, options);
  EXPECT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->precision(), precision) << (*engine)->precision_fallback();
  Router router(engine->get());
  std::vector<Outcome> out(count);
  int64_t submitted = 0, step = 0;
  while (submitted < count || (*engine)->Busy()) {
    while (submitted < count && submitted * stagger <= step) {
      GenerationRequest r = Request(submitted);
      if (label_of) r.label = label_of(submitted);
      if (r.label >= 0) r.guidance = guidance;
      EXPECT_TRUE(router.Submit(std::move(r), &out[submitted]).ok());
      ++submitted;
    }
    const StepStats st = router.Step();
    EXPECT_LE(st.batch, slots);
    ++step;
  }
  EXPECT_EQ((*engine)->pool().in_use(), 0);
  return out;
}

}  // namespace krause
