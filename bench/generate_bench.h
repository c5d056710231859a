// krause-generate-bench's parts (bench/generate_bench.cc): a measurement's record, the paper's
// configs, the timing of decode steps and of whole runs (generate_steps.cc), and the report of
// the records (generate_report.cc).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "model/pixel_model.h"

namespace krause::bench {

struct Record {
  std::string model, attention, image, method;
  int64_t streams = 0, position = -1;
  double images_per_second = 0, step_seconds = 0;
  int64_t kv_bytes_per_sequence = 0;
  std::string device = "cpu";
};

// The paper's MNIST ("mnist") or CIFAR-10 (any other `which`) model with `attention` (krause or
// softmax).
PixelModelConfig PaperConfig(const std::string& which, const std::string& attention);

using StepFn = std::function<at::Tensor(const at::Tensor& u, const at::Tensor& positions,
                                        const at::Tensor& slots)>;

// Median time of one decode step of S sequences at `position`, caches filled with random
// history (what the step reads; its cost does not depend on the values). The first `warmup`
// steps are not timed (a graphed step captures at its second).
double StepSeconds(const StepFn& step, int64_t s, int64_t position, int reps, int warmup = 1);

// Seconds to generate a whole image of n subpixels: the step times at the sampled positions,
// interpolated linearly over every position 0..n-1.
double IntegratedSeconds(const std::vector<int64_t>& positions, const std::vector<double>& times);

// Bytes read and written per second by a device-to-device copy of 2 x 2 GiB (median of 5, after
// a warm-up): what this device's memory gives a plain streaming kernel, measured in the same run
// as the decode steps it is compared with.
double CopyBytesPerSecond(const at::Device& device);

// The CPU's memory read bandwidth, measured in the same run: ATen's vectorised, multithreaded sum
// of 1 GiB of floats (far over the caches), median of 5 after a warm-up; bytes read per second.
double CpuReadBytesPerSecond();

// Random history in every layer of `cache`.
void FillRandom(const PixelModelConfig& c, PixelKvCache* cache);

// Images/s of S sequences generated end to end by the engine (its caches in `cache_dtype`).
double FullRun(const PixelModel& m, int64_t s, at::ScalarType cache_dtype = at::kFloat);

// --repeat_step: one decode step of the engine's kind (packed on the CPU) over caches of random
// history, repeated; prints the median step time. Everything else the bench does is left out, so
// that a profiler sees the step alone.
int RepeatStep(const std::string& spec, const std::string& device_name);

// The tables on stdout: images/s by method, step time against position, the ratios and the bytes
// per second of each step against `copy_bps` (the device's measured bandwidth). `param_bytes`:
// the weights' bytes per config + model (+ "w16": with bf16 linear weights).
void PrintReport(const std::vector<Record>& records, const std::vector<std::string>& configs,
                 const std::vector<int64_t>& streams, std::map<std::string, int64_t> param_bytes,
                 double copy_bps, const at::Device& device);

// --json: one JSON record per measurement.
void WriteJson(const std::string& path, const std::vector<Record>& records);

}  // namespace krause::bench
