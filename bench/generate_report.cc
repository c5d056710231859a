// krause-generate-bench's report (bench/generate_bench.h): the records as tables on stdout
// (images/s by method, step time against position, the ratios taken in the run, each step's bytes
// per second against the device's bandwidth) and as JSON.
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/generate_bench.h"

namespace krause::bench {
namespace {

std::string ToJson(const Record& r) {
  return absl::StrFormat(
      "{\"model\":\"%s\",\"attention\":\"%s\",\"image\":\"%s\",\"streams\":%d,\"method\":\"%s\","
      "\"images_per_second\":%.6g,\"step_seconds\":%.6g,\"position\":%d,\"kv_bytes_per_sequence\":%"
      "d,\"device\":\"%s\"}",
      r.model, r.attention, r.image, r.streams, r.method, r.images_per_second, r.step_seconds,
      r.position, r.kv_bytes_per_sequence, r.device);
}

// The per-position step records: eager, graphed (CUDA), graphed over a bf16 cache (CUDA), eager
// over a bf16 cache (a KARM on the CPU), eager with bf16 linear weights (the CPU).
struct StepMethod {
  const char* method;
  const char* label;
};
constexpr StepMethod kStepMethods[] = {{"step", ""},
                                       {"step_graph", "graphed "},
                                       {"step_bf16", "graphed bf16-cache "},
                                       {"step_bf16e", "bf16-cache "},
                                       {"step_w16", "bf16-weights "}};

bool IsStepMethod(const std::string& method) {
  for (const StepMethod& m : kStepMethods)
    if (method == m.method) return true;
  return false;
}

}  // namespace

void PrintReport(const std::vector<Record>& records, const std::vector<std::string>& configs,
                 const std::vector<int64_t>& streams, std::map<std::string, int64_t> param_bytes,
                 double copy_bps, const at::Device& device) {
  std::printf("\ndevice: %s\n%-6s %-5s %-9s %4s %-11s %10s %12s %14s\n", device.str().c_str(),
              "config", "model", "image", "S", "method", "images/s", "ms/step", "KV bytes/seq");
  for (const Record& r : records) {
    if (IsStepMethod(r.method)) continue;
    std::printf("%-6s %-5s %-9s %4lld %-11s %10.3f %12.3f %14lld\n", r.model.c_str(),
                r.attention.c_str(), r.image.c_str(), static_cast<long long>(r.streams),
                r.method.c_str(), r.images_per_second, r.step_seconds * 1e3,
                static_cast<long long>(r.kv_bytes_per_sequence));
  }
  auto find = [&](const std::string& model, const std::string& att, int64_t s,
                  const std::string& method, int64_t pos = -1) -> const Record* {
    for (const Record& r : records)
      if (r.model == model && r.attention == att && r.streams == s && r.method == method &&
          r.position == pos)
        return &r;
    return nullptr;
  };
  std::printf("\nStep time against position (ms):\n");
  for (const std::string& which : configs) {
    for (const char* att : {"KARM", "ARM"}) {
      for (int64_t s : streams) {
        for (const StepMethod& m : kStepMethods) {
          std::string line = absl::StrFormat("  %-6s %-5s S=%-3d %s", which, att, s, m.label);
          bool any = false;
          for (const Record& r : records)
            if (r.model == which && r.attention == att && r.streams == s && r.method == m.method) {
              line += absl::StrFormat(" %d:%.2f", r.position, r.step_seconds * 1e3);
              any = true;
            }
          if (any) std::printf("%s\n", line.c_str());
        }
      }
    }
  }
  std::printf("\nRatios (same run):\n");
  for (const std::string& which : configs) {
    for (int64_t s : streams) {
      // numerator model, method; denominator model, method; what the ratio is.
      struct Ratio {
        const char *model, *method, *over_model, *over_method, *label;
      };
      for (const Ratio& q :
           {Ratio{"KARM", "integrated", "ARM", "integrated", "KARM / ARM images/s (integrated)"},
            Ratio{"KARM", "full", "ARM", "full", "KARM / ARM images/s (full run)"},
            Ratio{"KARM", "integ_graph", "KARM", "integrated",
                  "KARM CUDA graph / eager images/s (integrated)"},
            Ratio{"KARM", "integ_graph", "ARM", "integrated",
                  "KARM (CUDA graph) / ARM images/s (integrated)"},
            Ratio{"KARM", "integ_bf16", "KARM", "integ_graph",
                  "KARM bf16 / fp32 cache images/s (graphed)"},
            Ratio{"KARM", "integ_bf16", "ARM", "integrated",
                  "KARM (graphed, bf16 cache) / ARM images/s (integrated)"},
            Ratio{"KARM", "integ_bf16e", "KARM", "integrated",
                  "KARM bf16 / fp32 cache images/s (integrated)"},
            Ratio{"KARM", "integ_bf16e", "ARM", "integrated",
                  "KARM (bf16 cache) / ARM images/s (integrated)"},
            Ratio{"KARM", "full_bf16", "ARM", "full",
                  "KARM (bf16 cache) / ARM images/s (full run)"},
            Ratio{"KARM", "full_bf16", "KARM", "full",
                  "KARM bf16 / fp32 cache images/s (full run)"},
            Ratio{"KARM", "integ_w16", "KARM", "integrated",
                  "KARM bf16 / fp32 weights images/s (integrated)"},
            Ratio{"ARM", "integ_w16", "ARM", "integrated",
                  "ARM bf16 / fp32 weights images/s (integrated)"},
            Ratio{"KARM", "full_w16", "KARM", "full",
                  "KARM bf16 / fp32 weights images/s (full run)"},
            Ratio{"ARM", "full_w16", "ARM", "full", "ARM bf16 / fp32 weights images/s (full run)"},
            Ratio{"KARM", "integ_w16", "ARM", "integ_w16",
                  "KARM / ARM images/s (integrated, bf16 weights)"},
            Ratio{"KARM", "full_w16", "ARM", "full_w16",
                  "KARM / ARM images/s (full run, bf16 weights)"}}) {
        const Record* x = find(which, q.model, s, q.method);
        const Record* y = find(which, q.over_model, s, q.over_method);
        if (x && y)
          std::printf("  %-6s S=%-3lld %s: %.2fx\n", which.c_str(), static_cast<long long>(s),
                      q.label, x->images_per_second / y->images_per_second);
      }
      for (const char* att : {"KARM", "ARM"}) {
        const Record* f = find(which, att, s, "full");
        const Record* i = find(which, att, s, "integrated");
        if (f && i)
          std::printf("  %-6s S=%-3lld %-4s integrated / full images/s: %.3f (method check)\n",
                      which.c_str(), static_cast<long long>(s), att,
                      i->images_per_second / f->images_per_second);
      }
    }
    for (const char* att : {"KARM", "ARM"}) {
      const Record* one = find(which, att, 1, "integrated");
      const Record* many = find(which, att, streams.back(), "integrated");
      if (one && many)
        std::printf("  %-6s %-4s images/s with S=%lld vs S=1: %.2fx\n", which.c_str(), att,
                    static_cast<long long>(streams.back()),
                    many->images_per_second / one->images_per_second);
    }
    // What one decode step must read at its last position: every sequence's whole cache (the
    // ring for KARM, the full prefix for ARM) and the weights once; per second of step time.
    for (const char* att : {"KARM", "ARM"}) {
      for (int64_t s : streams) {
        for (const StepMethod& m : kStepMethods) {
          const Record* last = nullptr;
          for (const Record& r : records)
            if (r.model == which && r.attention == att && r.streams == s && r.method == m.method)
              last = &r;
          if (last == nullptr) continue;
          const std::string weights = std::string(m.method) == "step_w16" ? "w16" : "";
          const double bytes = static_cast<double>(s) * last->kv_bytes_per_sequence +
                               param_bytes[which + att + weights];
          const double bps = bytes / last->step_seconds;
          std::printf("  %-6s %-4s S=%-3lld %sstep at position %lld reads %.1f MB: %.1f GB/s",
                      which.c_str(), att, static_cast<long long>(s), m.label,
                      static_cast<long long>(last->position), bytes / 1e6, bps / 1e9);
          if (copy_bps > 0) {
            std::printf(" (%.0f%% of the %s %.0f GB/s)", 100 * bps / copy_bps,
                        device.is_cuda() ? "device copy's" : "CPU's measured read bandwidth,",
                        copy_bps / 1e9);
          }
          std::printf("\n");
        }
      }
    }
    if (which == "cifar") {
      for (int64_t s : streams) {
        const Record* a = find(which, "KARM", s, "step", 300);
        const Record* b = find(which, "KARM", s, "step", 3000);
        if (a && b)
          std::printf("  cifar  KARM S=%-3lld step time at 3000 / at 300: %.3f\n",
                      static_cast<long long>(s), b->step_seconds / a->step_seconds);
      }
    }
  }
}

void WriteJson(const std::string& path, const std::vector<Record>& records) {
  std::ofstream js(path);
  js << "[\n";
  for (size_t i = 0; i < records.size(); ++i)
    js << "  " << ToJson(records[i]) << (i + 1 < records.size() ? ",\n" : "\n");
  js << "]\n";
}

}  // namespace krause::bench
