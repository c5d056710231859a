// krause-check: the server's load-time kernel check without a server (model/engine/kernel_check.h).
// For each checkpoint, every implementation the server would try on --device, in order, against
// the reference operator on the CPU; prints one verdict line per model first, then each check.
// Exit code: 0 when every model passes on its first implementation (what the server would serve
// it on without falling back), 1 when one falls back, 2 when one passes on none or fails to load.
// scripts/device-check.sh runs it on the GPU before anything else.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "model/attention/cpu_kernels.h"
#include "model/engine/kernel_check.h"
#include "model/loader.h"
#include "model/util/help.h"
#include "model/util/threads.h"

ABSL_FLAG(std::string, device, "cpu", "the device the models would serve on: cpu, cuda, cuda:N");
ABSL_FLAG(std::string, attention_impl, "auto",
          "auto (every implementation in the server's order) or one of cuda, fused_cpu, windowed");
ABSL_FLAG(std::string, kv_cache_dtype, "float32",
          "generators' cache dtype on a GPU: float32, bfloat16, float16");
ABSL_FLAG(std::string, weights_dtype, "float32",
          "the linear layers' weights as served: float32, or bfloat16 (rounded at load; the\n"
          "reference computes with the same rounded weights)");
ABSL_FLAG(int, threads, 0, "intra-op threads (0: all cores)");

int main(int argc, char** argv) {
  krause::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "the server's load-time kernel check without a server: each checkpoint's implementations\n"
      "on --device against the reference operator on the CPU, verdicts first.\n"
      "  krause-check models/*.safetensors\n"
      "  krause-check --device cuda models/*.safetensors\n"
      "Exit code 0: every model passes on its first implementation; 1: one falls back; 2: one\n"
      "passes on none (the server would not serve it) or does not load.");
  std::vector<char*> files = absl::ParseCommandLine(argc, argv);
  files.erase(files.begin());
  if (files.empty()) {
    std::fprintf(stderr, "krause-check: name at least one checkpoint (see --help)\n");
    return 2;
  }
  krause::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  const std::string device = absl::GetFlag(FLAGS_device);
  auto forced = krause::ParseServingImpl(absl::GetFlag(FLAGS_attention_impl));
  auto chain = forced.ok() ? krause::ServingChain(device, *forced)
                           : absl::StatusOr<std::vector<krause::ServingChoice>>(forced.status());
  if (!chain.ok()) {
    std::fprintf(stderr, "krause-check: %s\n", std::string(chain.status().message()).c_str());
    return 2;
  }
  const std::string weights_name = absl::GetFlag(FLAGS_weights_dtype);
  const auto weights = krause::ParseLinearDtype(weights_name, "--weights_dtype");
  if (!weights.ok()) {
    std::fprintf(stderr, "krause-check: %s\n", std::string(weights.status().message()).c_str());
    return 2;
  }
  if (const char* e = krause::cpu::CpuKernelsChoiceError(); *e != '\0') {
    std::fprintf(stderr, "krause-check: %s\n", e);
    return 2;
  }
  const std::string dtype_name = absl::GetFlag(FLAGS_kv_cache_dtype);
  const at::ScalarType dtype = dtype_name == "bfloat16"  ? at::kBFloat16
                               : dtype_name == "float16" ? at::kHalf
                                                         : at::kFloat;
  int worst = 0;
  std::vector<std::string> verdicts, details;
  for (const char* file : files) {
    auto cpu = krause::LoadModel(file, "cpu", *weights);
    if (!cpu.ok()) {
      verdicts.push_back(std::string("FAILED ") + file + ": " +
                         std::string(cpu.status().message()));
      worst = 2;
      continue;
    }
    std::string verdict;
    for (size_t i = 0; i < chain->size() && verdict.empty(); ++i) {
      const krause::ServingChoice& choice = (*chain)[i];
      auto model = choice.device == "cpu" ? cpu : krause::LoadModel(file, choice.device, *weights);
      krause::KernelCheck c;
      if (!model.ok()) {
        c.choice = choice;
        c.outcome = krause::CheckOutcome::kError;
        c.where = std::string(model.status().message());
      } else {
        c = krause::CheckLoadedModel(*model, *cpu, choice, dtype);
      }
      details.push_back(std::string("  ") + file + ": " + c.Summary());
      if (c.passed()) {
        verdict = std::string(i == 0 ? "PASS    " : "FALLBACK") + " " + file + ": serves on " +
                  krause::KrauseImplName(choice.impl) + " (" + choice.device + ")";
        if (i > 0 && worst < 1) worst = 1;
      }
    }
    if (verdict.empty()) {
      verdict = std::string("FAILED   ") + file + ": no implementation passed";
      worst = 2;
    }
    verdicts.push_back(verdict);
  }
  std::printf("krause-check on %s (CPU kernels %s, %s weights): %s\n", device.c_str(),
              krause::cpu::CpuKernels().name, weights_name.c_str(),
              worst == 0   ? "every model passes on its first implementation"
              : worst == 1 ? "a model falls back"
                           : "a model would not be served");
  for (const std::string& v : verdicts) std::printf("%s\n", v.c_str());
  for (const std::string& d : details) std::printf("%s\n", d.c_str());
  return worst;
}
