// A generation request as the core takes it: the settings only, in native types, whatever
// protocol carried them. Every front end's parser fills one (krause.v1's GenerateRequest:
// v1/requests.cc; the HTTP generation's JSON body: v1/generate_body.cc; the Open Inference
// Protocol's infer: oip/oip_infer.cc), each wire name mapped to its field there and nowhere else;
// ResolveGenerate (operations.h) then resolves it once against the model: defaults, limits,
// guidance, seed, and how the answer goes out.
// Free of the server's and LibTorch's types, so that the body parser's fuzzer builds it alone.
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace krause::server {

// How a generation's answer goes out: every row as it completes, progress only, or everything
// at the end in one answer.
enum class GenerateOutput { kRows, kProgress, kFinal };

// A request image as sent: PNG bytes, or raw HWC pixels with their size.
struct RequestImage {
  bool png = true;
  std::string bytes;
  int64_t height = 0, width = 0, channels = 0;  // raw only
};

struct GenerateSettings {
  int64_t num_images = 0;        // 0: 1
  std::optional<uint64_t> seed;  // unset: a random one
  std::optional<double> temperature, top_p, guidance;
  std::optional<int64_t> top_k;  // 0: off (every value may be drawn)
  // The class of every image, by label or by index (at most one of the two); or, per image,
  // the model's class rows (-1: that image has none), checked by the front end (the Open
  // Inference Protocol's class_index tensor).
  std::optional<std::string> label;
  std::optional<int64_t> class_index;
  std::vector<int64_t> image_classes;
  // A completion: the prompt image and how many of its rows are kept. `prompt_field` is the
  // prompt's wire name, as errors cite it ("prompt" for krause.v1's Image, "prompt_png").
  std::optional<RequestImage> prompt;
  std::string prompt_field = "prompt";
  int64_t prompt_rows = 0;
  uint64_t first_image = 0;  // image i is the call's image first_image + i (a resume)
  // Streaming: progress at most every update_interval_ms (0: 100), whole rows unless
  // stream_rows is false. answer_once: the call answers once, at the end (GenerateOutput::kFinal).
  int64_t update_interval_ms = 0;
  std::optional<bool> stream_rows;
  bool answer_once = false;
  int64_t timeout_us = 0;  // 0: the call's own deadline only
  // The call's priority within its tenant (tenants.h; checked against its max_priority), and its
  // wire name for errors.
  int64_t priority = 0;
  std::string priority_field = "priority";
};

}  // namespace krause::server
