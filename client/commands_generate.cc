// krause-client generate and complete: a Generate stream (from a prompt's first rows for
// complete) through the resuming client (client/resume.h), a live progress bar on stderr, and
// the images written as PNG files.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/flags.h"
#include "client/resume.h"
#include "model/util/files.h"

namespace krause::client::cli {
namespace {

using nlohmann::json;

std::string Bar(double fraction, int width = 30) {
  const int full = static_cast<int>(fraction * width + 0.5);
  return std::string(full, '#') + std::string(width - full, '.');
}

}  // namespace

int Generate(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
             const std::string& prompt_file) {
  v1::GenerateRequest req;
  req.set_model(absl::GetFlag(FLAGS_model));
  req.set_version(absl::GetFlag(FLAGS_model_version));
  req.set_num_images(static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_num))));
  if (absl::GetFlag(FLAGS_seed) >= 0)
    req.set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  // Negative: unset, so that the model's sampling defaults apply.
  if (absl::GetFlag(FLAGS_temperature) >= 0)
    req.set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  if (absl::GetFlag(FLAGS_top_p) >= 0)
    req.set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  req.set_top_k(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_top_k))));
  req.set_priority(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_priority))));
  req.set_stream_rows(false);  // the client only needs the progress and the final PNGs
  auto cls = ChosenClass();
  if (!cls.ok()) return Fail(cls.status().ToString());
  if (!cls->label.empty()) req.set_label(cls->label);
  if (cls->index >= 0) req.set_class_index(static_cast<uint32_t>(cls->index));
  if (absl::GetFlag(FLAGS_guidance) >= 0)
    req.set_guidance(static_cast<float>(absl::GetFlag(FLAGS_guidance)));
  if (!prompt_file.empty()) {
    auto bytes = krause::ReadFileToString(prompt_file);
    if (!bytes.ok()) return Fail(bytes.status().ToString());
    req.mutable_prompt()->set_png(std::move(*bytes));
    req.set_prompt_rows(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_rows))));
  }
  const std::string out_dir = absl::GetFlag(FLAGS_out);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  krause::client::ResumeOptions ro;
  ro.resume = absl::GetFlag(FLAGS_resume);
  ro.max_resumes = std::max(0, absl::GetFlag(FLAGS_max_resumes));
  ro.deadline_seconds = o.timeout_seconds;
  ro.attempt_timeout_seconds = absl::GetFlag(FLAGS_attempt_timeout);
  krause::client::ResumingGenerate reader(&stub, o, req, ro);
  v1::GenerateResponse msg;
  std::vector<std::string> written;
  v1::GenerateSummary summary;
  const bool progress = absl::GetFlag(FLAGS_progress) && !as_json;
  const auto start = std::chrono::steady_clock::now();
  while (reader.Read(&msg)) {
    for (const auto& im : msg.images()) {
      const std::string path = (std::filesystem::path(out_dir) /
                                absl::StrCat(absl::GetFlag(FLAGS_prefix), "-", im.image(), ".png"))
                                   .string();
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f) return Fail(absl::StrCat(path, ": cannot write"));
      std::fwrite(im.png().data(), 1, im.png().size(), f);
      std::fclose(f);
      written.push_back(path);
    }
    if (progress) {
      const auto& p = msg.progress();
      const double frac = p.pixels_total() ? double(p.pixels_done()) / p.pixels_total() : 1.0;
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\r[%s] %5.1f%% %llu/%llu px  images %u/%u  %.1fs eta %.1fs ",
                   Bar(frac).c_str(), 100 * frac, static_cast<unsigned long long>(p.pixels_done()),
                   static_cast<unsigned long long>(p.pixels_total()), p.images_done(),
                   p.images_total(), el, frac > 0 ? el / frac - el : 0.0);
    }
    if (msg.has_summary()) summary = msg.summary();
  }
  if (progress) std::fprintf(stderr, "\n");
  const grpc::Status st = reader.Finish();
  const krause::client::ResumeStats rs = reader.stats();
  for (const std::string& b : rs.breaks)
    std::fprintf(stderr, "stream broke (%s)%s\n", b.c_str(), ro.resume ? "; resuming" : "");
  if (!st.ok()) return FailRpc(prompt_file.empty() ? "generate" : "complete", st, o);
  if (as_json) {
    std::cout << json{{"model", summary.model()},
                      {"files", written},
                      {"images", summary.images()},
                      {"pixels_generated", summary.pixels_generated()},
                      {"seconds", summary.seconds()},
                      {"seconds_to_first_pixel", summary.seconds_to_first_pixel()},
                      {"seed", summary.seed()},
                      {"flops_executed", summary.flops_executed()},
                      {"flops_dense_equivalent", summary.flops_dense_equivalent()},
                      {"model_version", summary.model_version()},
                      {"resumed_streams", rs.resumed_calls},
                      {"images_resumed", rs.images_resumed},
                      {"rows_kept", rs.rows_kept},
                      {"rows_recomputed", rs.rows_recomputed}}
                     .dump(2)
              << "\n";
  } else {
    for (const auto& w : written) std::printf("wrote %s\n", w.c_str());
    std::printf("%s: %u image(s), %llu pixels in %.2f s (first pixel after %.3f s), seed %llu\n",
                summary.model().c_str(), summary.images(),
                static_cast<unsigned long long>(summary.pixels_generated()), summary.seconds(),
                summary.seconds_to_first_pixel(), static_cast<unsigned long long>(summary.seed()));
    std::printf("FLOPs: %.4g executed, %.4g dense-equivalent (%.1f%% saved)\n",
                summary.flops_executed(), summary.flops_dense_equivalent(),
                summary.flops_dense_equivalent() > 0
                    ? 100.0 * (1 - summary.flops_executed() / summary.flops_dense_equivalent())
                    : 0.0);
    if (rs.resumed_calls > 0)
      std::printf(
          "resumed: %lld stream(s) broke; %lld image(s) continued on %lld call(s), "
          "%lld row(s) kept, %lld row(s) recomputed\n",
          static_cast<long long>(rs.breaks.size()), static_cast<long long>(rs.images_resumed),
          static_cast<long long>(rs.resumed_calls), static_cast<long long>(rs.rows_kept),
          static_cast<long long>(rs.rows_recomputed));
  }
  return 0;
}

}  // namespace krause::client::cli
