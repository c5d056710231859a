// What the server tells about a served model, in native types: the registry fills it once at
// load; the service converts it to the public krause.v1.ModelInfo at the edge
// (model_info_proto.h), so that protobuf stays out of the registry, the workers and the metrics.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/attention_kind.h"

namespace krause::server {

struct ImageShape {
  int64_t height = 0, width = 0, channels = 0;
};

enum class ModelKind { kClassifier, kGenerator };
const char* ModelKindName(ModelKind kind);  // "classifier", "generator"

// One implementation the load-time kernel check tried (model/engine/kernel_check.h), in order.
struct KernelCheckRecord {
  std::string implementation;  // cuda, fused_cpu, windowed
  std::string device;          // where it ran
  std::string result;          // passed, mismatch, non_finite, error, unchecked
  double max_abs_diff = 0, tolerance = 0;
  std::string detail;   // where the worst difference is, or the error
  double seconds = 0;   // the check's wall time
  std::string summary;  // the whole as one log line
};

struct ModelInfo {
  std::string name;
  int64_t version = 1;  // the version of its weights (ModelSpec::version)
  ModelKind kind = ModelKind::kClassifier;
  AttentionKind attention = AttentionKind::kKrause;  // model/attention_kind.h
  bool is_default = false;                           // the default model of its kind
  ImageShape shape;  // input (classifiers) or output (generators) image
  std::vector<std::string> labels;
  int64_t classes = 0;         // generators: 0 unconditional
  int64_t window = 0;          // Krause models: neighbourhood radius / causal window
  std::vector<int64_t> top_k;  // Krause models: per layer
  int64_t parameters = 0;
  double flops_per_image_executed = 0, flops_per_image_dense_equivalent = 0;
  std::string device;              // "cpu", "cuda:N"
  int64_t max_batch_size = 0;      // classifiers: images per batch; generators: engine slots
  int64_t max_queue_delay_ms = 0;  // classifiers
  int64_t max_images_per_request = 0;
  int64_t kv_cache_bytes_per_sequence = 0;  // generators
  std::string kv_cache_dtype;               // generators: "float32", "bfloat16" or "float16"
  std::string weights_dtype;                // the linear layers' weights: "float32" or "bfloat16"
  // The CPU kernels' variant the process runs ("base", "avx2", "avx512": cpu::CpuKernels());
  // empty for a model served on a GPU.
  std::string cpu_kernels;
  // The arithmetic served (model/precision.h): "fp32" or "bf16"; a model asked for bf16 that
  // computes in fp32 (no AMX, or an implementation without bf16) says why in
  // precision_fallback. linear_kernels: what computes the linear layers ("avx512", or oneDNN's
  // kernel, "onednn brg:avx512_core_amx_bf16"); empty where LibTorch or CUDA does.
  std::string precision = "fp32";
  // Generators: what decides an image's bits besides the request, for resuming a stream on
  // another replica (GenerateStart.numerics): the precision, the implementation and its device
  // kind, the CPU kernels' bit family (cpu::CpuKernelFamily), the weights' and the cache's
  // dtypes. Set with the kernel check's outcome (GenerationNumerics).
  std::string numerics;
  std::string precision_fallback;
  std::string linear_kernels;
  std::string checkpoint;  // the file it was loaded from
  // Generators: what a request that leaves a sampling field unset gets (ServedGenerator).
  std::optional<double> default_temperature, default_top_p, default_guidance;
  std::optional<int64_t> default_top_k;
  std::string summary;  // the checkpoint's training summary (JSON), if any
  // What it is served on (cuda, fused_cpu, windowed: the kernel check's choice, or the first
  // unchecked with --kernel_check=off), and the check of each implementation tried.
  std::string implementation;
  std::vector<KernelCheckRecord> kernel_checks;
};

// The log line of a model's kernel check: "model NAME version V: serving on IMPL (DEVICE);
// kernel check: SUMMARY; SUMMARY ...", each implementation tried in order.
std::string KernelCheckLine(const ModelInfo& info);

// ModelInfo::numerics of a generator, e.g. "fp32 fused_cpu on cpu, avx2 kernel family, float32
// weights, float32 cache".
std::string GenerationNumerics(const ModelInfo& info);

}  // namespace krause::server
