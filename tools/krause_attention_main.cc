// krause-attention: what each model's attention keeps, averaged over test images (the figures
// behind docs/attention.md). See --help.
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/progress.h"
#include "model/data/datasets.h"
#include "model/data/png.h"
#include "model/engine/inspect.h"
#include "model/loader.h"
#include "model/train/plot.h"
#include "model/util/help.h"
#include "model/util/threads.h"

ABSL_FLAG(std::string, models,
          "models/krause_vit_fmnist.safetensors,models/vit_fmnist.safetensors,"
          "models/karm_fmnist.safetensors,models/arm_fmnist.safetensors",
          "checkpoints, comma-separated (classifiers and generators)");
ABSL_FLAG(std::string, data, "fashion-mnist", "test data: fashion-mnist | mnist | cifar10");
ABSL_FLAG(std::string, data_dir, "",
          "data set folder (default for fashion-mnist: the Debian package's)");
ABSL_FLAG(int64_t, images, 1000, "test images, the first N of the test set");
ABSL_FLAG(bool, with_class, true,
          "conditional generators read each image given its own class (false: no class)");
ABSL_FLAG(std::string, out, "attention-out", "output folder: attention.json, attention.png");
ABSL_FLAG(int, threads, 0, "intra-op threads (0: all cores)");

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "krause-attention: %s\n", msg.c_str());
  return 1;
}

// Per layer, the mean over heads and images of each figure.
struct LayerFigures {
  double sink_share = 0, effective_neighbours = 0, busiest_key_share = 0, mean_distance = 0;
  double busiest_is_special = 0;  // share of (image, head) whose busiest key is CLS / start
};

}  // namespace

int main(int argc, char** argv) {
  krause::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "what each model's attention keeps, averaged over test images.\n"
      "  krause-attention --images 1000 --out bench/results/attention-sinks\n"
      "For every model and every test image: the Inspect figures (model/engine/inspect.h) of\n"
      "each layer and head, from the model's own forward on the CPU: sink share (mean over\n"
      "queries of the largest weight), effective neighbours (mean exp(entropy)), the busiest\n"
      "key's share of all the weight, and the mean distance to the keys. Prints a table (per\n"
      "model and layer: the mean over heads and images), writes OUT/attention.json and\n"
      "OUT/attention.png (one panel per figure: each model's per-layer means, x = layer).");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument ", rest[1], " (see --help)"));
  krause::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  const int64_t n = absl::GetFlag(FLAGS_images);
  if (n < 1) return Fail("--images must be >= 1");
  auto test = krause::LoadDataset(absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_data_dir), false);
  if (!test.ok()) return Fail(test.status().ToString());
  if (n > test->size())
    return Fail(absl::StrCat("--images ", n, ": the test set has ", test->size()));
  const std::vector<std::string> paths =
      absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty());
  std::vector<krause::LoadedModel> models;
  for (const std::string& p : paths) {
    auto m = krause::LoadModel(p, "cpu");
    if (!m.ok()) return Fail(m.status().ToString());
    models.push_back(std::move(*m));
  }
  const std::string out_dir = absl::GetFlag(FLAGS_out);
  std::filesystem::create_directories(out_dir);
  krause::InspectOptions o;
  o.queries = {0};  // the figures cover every query; list one
  krause::bench::Progress progress;
  progress.total = static_cast<int>(n * models.size());
  nlohmann::json report = {{"data", absl::GetFlag(FLAGS_data)},
                           {"images", n},
                           {"with_class", absl::GetFlag(FLAGS_with_class)},
                           {"models", nlohmann::json::array()}};
  std::vector<std::vector<LayerFigures>> all;
  std::printf("%-24s %-7s %5s %11s %21s %18s %24s %14s\n", "model", "kind", "layer", "sink_share",
              "effective_neighbours", "busiest_key_share", "busiest_is_cls_or_start",
              "mean_distance");
  for (size_t mi = 0; mi < models.size(); ++mi) {
    const krause::LoadedModel& m = models[mi];
    const std::string name = std::filesystem::path(paths[mi]).stem().string();
    std::vector<LayerFigures> layers;
    bool krause_attention = false;
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor image = test->images[i];  // [C, H, W]
      absl::StatusOr<krause::Inspection> in;
      if (m.classifier()) {
        in = krause::InspectClassifier(*m.vit, image, o);
      } else {
        const krause::PixelModelConfig& c = m.pixel->config();
        const int64_t cls = c.conditional() && absl::GetFlag(FLAGS_with_class)
                                ? test->labels[i].item<int64_t>()
                                : -1;
        in = krause::InspectGenerator(*m.pixel, image.permute({1, 2, 0}).reshape({-1}), cls, o);
      }
      if (!in.ok())
        return Fail(absl::StrCat(paths[mi], ", image ", i, ": ", in.status().message()));
      krause_attention = in->krause;
      layers.resize(in->layers.size());
      for (size_t l = 0; l < in->layers.size(); ++l) {
        const auto& heads = in->layers[l].heads;
        const double w = 1.0 / (static_cast<double>(heads.size()) * n);
        for (const krause::HeadAttention& h : heads) {
          layers[l].sink_share += h.sink_share * w;
          layers[l].effective_neighbours += h.effective_neighbours * w;
          layers[l].busiest_key_share += h.busiest_key_share * w;
          layers[l].mean_distance += h.mean_distance * w;
          if (in->positions[h.busiest_key].first < 0) layers[l].busiest_is_special += w;
        }
      }
      progress.Step(absl::StrCat(name, ": image ", i + 1, " of ", n));
    }
    nlohmann::json per_layer = nlohmann::json::array();
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerFigures& f = layers[l];
      per_layer.push_back({{"layer", l},
                           {"sink_share", f.sink_share},
                           {"effective_neighbours", f.effective_neighbours},
                           {"busiest_key_share", f.busiest_key_share},
                           {"mean_distance", f.mean_distance},
                           {"busiest_is_cls_or_start", f.busiest_is_special}});
    }
    report["models"].push_back({{"checkpoint", paths[mi]},
                                {"name", name},
                                {"kind", m.classifier() ? "classifier" : "generator"},
                                {"attention", krause_attention ? "krause" : "softmax"},
                                {"layers", per_layer}});
    all.push_back(layers);
  }
  for (size_t mi = 0; mi < models.size(); ++mi) {
    for (size_t l = 0; l < all[mi].size(); ++l) {
      const LayerFigures& f = all[mi][l];
      std::printf("%-24s %-7s %5zu %11.3f %21.2f %18.3f %24.2f %14.2f\n",
                  report["models"][mi]["name"].get<std::string>().c_str(),
                  report["models"][mi]["attention"].get<std::string>().c_str(), l, f.sink_share,
                  f.effective_neighbours, f.busiest_key_share, f.busiest_is_special,
                  f.mean_distance);
    }
  }
  std::ofstream(out_dir + "/attention.json") << report.dump(2) << "\n";
  // One row of panels per kind (classifiers, then generators), one panel per figure (sink share,
  // effective neighbours, busiest key share); a line per model (x = layer). Krause models in
  // warm colours, softmax models in cool ones, in the order given.
  const uint8_t warm[][3] = {{220, 60, 30}, {240, 160, 20}, {180, 30, 120}};
  const uint8_t cool[][3] = {{40, 90, 220}, {30, 170, 170}, {110, 60, 200}};
  std::vector<at::Tensor> rows;
  for (const char* kind : {"classifier", "generator"}) {
    std::vector<at::Tensor> panels;
    for (int figure = 0; figure < 3; ++figure) {
      std::vector<krause::Series> series;
      int nk = 0, ns = 0;
      for (size_t mi = 0; mi < models.size(); ++mi) {
        if (report["models"][mi]["kind"] != kind) continue;
        const bool k = report["models"][mi]["attention"] == "krause";
        const uint8_t* c = k ? warm[nk++ % 3] : cool[ns++ % 3];
        krause::Series s{{}, {}, c[0], c[1], c[2]};
        for (size_t l = 0; l < all[mi].size(); ++l) {
          const LayerFigures& f = all[mi][l];
          s.x.push_back(static_cast<double>(l));
          s.y.push_back(figure == 0   ? f.sink_share
                        : figure == 1 ? f.effective_neighbours
                                      : f.busiest_key_share);
        }
        series.push_back(std::move(s));
      }
      if (!series.empty()) panels.push_back(krause::PlotPanel(series, 360, 280));
    }
    if (!panels.empty()) rows.push_back(at::cat(panels, 1));
  }
  if (rows.empty()) return Fail("no model to plot");
  if (rows.size() == 2 && rows[0].size(1) != rows[1].size(1)) return Fail("uneven panel rows");
  if (absl::Status st = krause::WritePng(out_dir + "/attention.png", at::cat(rows, 0)); !st.ok()) {
    return Fail(st.ToString());
  }
  std::printf("wrote %s/attention.json and %s/attention.png\n", out_dir.c_str(), out_dir.c_str());
  return 0;
}
