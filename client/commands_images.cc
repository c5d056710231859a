// krause-client classify, score and inspect: images in (PNG files, or IDX files sliced with
// --index), split into calls the model accepts; the top classes, the bits per dimension (given
// the classes, if asked), or what the attention keeps on one image (client/inspect.h).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/flags.h"
#include "client/inspect.h"

namespace krause::client::cli {

using nlohmann::json;

int Classify(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
             const std::vector<std::string>& files) {
  auto inputs = ReadInputs(files);
  if (!inputs.ok()) return Fail(inputs.status().ToString());
  auto per_call = ImagesPerCall(stub, o, v1::ModelInfo::CLASSIFIER);
  if (!per_call.ok()) return Fail(per_call.status().ToString());
  const int batch = *per_call;
  json results = json::array();
  double executed = 0, dense = 0;
  for (size_t s = 0; s < inputs->size(); s += batch) {
    v1::ClassifyRequest req;
    req.set_model(absl::GetFlag(FLAGS_model));
    req.set_version(absl::GetFlag(FLAGS_model_version));
    req.set_top_k(static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_top))));
    req.set_priority(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_priority))));
    const size_t e = std::min(inputs->size(), s + batch);
    for (size_t i = s; i < e; ++i) *req.add_images() = (*inputs)[i].image;
    grpc::ClientContext ctx;
    krause::client::PrepareContext(o, &ctx);
    v1::ClassifyResponse r;
    const grpc::Status st = stub.Classify(&ctx, req, &r);
    if (!st.ok()) return FailRpc("classify", st, o);
    executed += r.flops_executed();
    dense += r.flops_dense_equivalent();
    for (int i = 0; i < r.results_size(); ++i) {
      const std::string& name = (*inputs)[s + i].name;
      json top = json::array();
      std::string line = name + ":";
      for (const auto& c : r.results(i).top()) {
        top.push_back(
            {{"index", c.index()}, {"label", c.label()}, {"probability", c.probability()}});
        absl::StrAppend(&line, "  ", c.label().empty() ? absl::StrCat(c.index()) : c.label(), " ",
                        absl::StrFormat("%.3f", c.probability()));
      }
      results.push_back({{"input", name}, {"model", r.model()}, {"top", top}});
      if (!as_json) std::printf("%s\n", line.c_str());
    }
  }
  if (as_json) {
    std::cout << json{{"results", results},
                      {"flops_executed", executed},
                      {"flops_dense_equivalent", dense}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("FLOPs: %.4g executed, %.4g dense-equivalent (%.1f%% saved)\n", executed, dense,
                dense > 0 ? 100.0 * (1 - executed / dense) : 0.0);
  }
  return 0;
}

int Score(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
          const std::vector<std::string>& files) {
  auto inputs = ReadInputs(files);
  if (!inputs.ok()) return Fail(inputs.status().ToString());
  auto cls = ChosenClass();
  if (!cls.ok()) return Fail(cls.status().ToString());
  auto indices = ScoreIndices(inputs->size());
  if (!indices.ok()) return Fail(indices.status().ToString());
  if (cls->any() && !indices->empty())
    return Fail("give --labels_file or one --label / --class_index, not both");
  auto per_call = ImagesPerCall(stub, o, v1::ModelInfo::GENERATOR);
  if (!per_call.ok()) return Fail(per_call.status().ToString());
  const int batch = *per_call;
  json results = json::array();
  double sum = 0;
  std::string model;
  for (size_t s = 0; s < inputs->size(); s += batch) {
    v1::ScoreRequest req;
    req.set_model(absl::GetFlag(FLAGS_model));
    req.set_version(absl::GetFlag(FLAGS_model_version));
    const size_t e = std::min(inputs->size(), s + batch);
    for (size_t i = s; i < e; ++i) {
      *req.add_images() = (*inputs)[i].image;
      if (!cls->label.empty()) req.add_labels(cls->label);
      if (cls->index >= 0) req.add_class_indices(cls->index);
      if (!indices->empty()) req.add_class_indices(static_cast<int32_t>((*indices)[i]));
    }
    grpc::ClientContext ctx;
    krause::client::PrepareContext(o, &ctx);
    v1::ScoreResponse r;
    const grpc::Status st = stub.Score(&ctx, req, &r);
    if (!st.ok()) return FailRpc("score", st, o);
    model = r.model();
    for (int i = 0; i < r.bits_per_dim_size(); ++i) {
      sum += r.bits_per_dim(i);
      results.push_back({{"input", (*inputs)[s + i].name}, {"bits_per_dim", r.bits_per_dim(i)}});
      if (!as_json)
        std::printf("%s: %.4f bits/dim\n", (*inputs)[s + i].name.c_str(), r.bits_per_dim(i));
    }
  }
  const double mean = sum / static_cast<double>(inputs->size());
  if (as_json) {
    std::cout << json{{"model", model}, {"results", results}, {"mean_bits_per_dim", mean}}.dump(2)
              << "\n";
  } else {
    std::printf("%s: mean %.4f bits/dim over %zu image(s) in %zu call(s)%s\n", model.c_str(), mean,
                inputs->size(), (inputs->size() + batch - 1) / batch,
                cls->any() || !indices->empty() ? ", given the classes" : "");
  }
  return 0;
}

int Inspect(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
            const std::string& file) {
  auto inputs = ReadInputs({file});
  if (!inputs.ok()) return Fail(inputs.status().ToString());
  if (inputs->size() != 1)
    return Fail(absl::StrCat(file, ": inspect takes one image (choose it with --index I)"));
  auto cls = ChosenClass();
  if (!cls.ok()) return Fail(cls.status().ToString());
  krause::client::InspectArgs a;
  a.model = absl::GetFlag(FLAGS_model);
  a.version = absl::GetFlag(FLAGS_model_version);
  for (auto [flag, text, out] : {std::tuple{"layer", absl::GetFlag(FLAGS_layer), &a.layers},
                                 std::tuple{"head", absl::GetFlag(FLAGS_head), &a.heads},
                                 std::tuple{"query", absl::GetFlag(FLAGS_query), &a.queries}}) {
    auto list = krause::client::ParseIndexList(text, flag);
    if (!list.ok()) return Fail(list.status().ToString());
    *out = std::move(*list);
  }
  a.top_k = absl::GetFlag(FLAGS_top_k);
  a.label = cls->label;
  a.class_index = cls->index;
  a.out = absl::GetFlag(FLAGS_out);
  a.summary = absl::GetFlag(FLAGS_summary);
  a.as_json = as_json;
  return krause::client::Inspect(stub, o, (*inputs)[0].image, (*inputs)[0].name, a);
}

}  // namespace krause::client::cli
