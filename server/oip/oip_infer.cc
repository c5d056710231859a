#include "server/oip/oip_infer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/core/image_input.h"
#include "server/core/served_model.h"
#include "server/edge/generation_collector.h"
#include "server/edge/status.h"

namespace krause::server::oip {
namespace {

constexpr char kRpc[] = "ModelInfer";

// The request's inputs by name; an unknown or repeated name, or a missing required one, is an
// error naming it and the model's inputs.
absl::StatusOr<std::map<std::string, const Tensor*>> InputsByName(
    const InferRequest& r, const ServedModel& m, const std::vector<std::string>& allowed) {
  std::map<std::string, const Tensor*> out;
  for (const Tensor& t : r.inputs) {
    if (std::find(allowed.begin(), allowed.end(), t.name) == allowed.end())
      return absl::InvalidArgumentError(absl::StrCat("unknown input \"", t.name.substr(0, 64),
                                                     "\": model ", m.name(), " takes ",
                                                     absl::StrJoin(allowed, ", ")));
    if (!out.emplace(t.name, &t).second)
      return absl::InvalidArgumentError(absl::StrCat("input ", t.name, " is given twice"));
  }
  return out;
}

// Every parameter of the request is one the call knows.
absl::Status CheckParameterNames(const InferRequest& r, const ServedModel& m, const char* what,
                                 const std::vector<std::string>& known) {
  for (const auto& [name, value] : r.parameters) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("unknown parameter \"", name.substr(0, 64), "\": model ", m.name(), " (", what,
                     ") takes ", known.empty() ? "no parameters" : absl::StrJoin(known, ", ")));
  }
  return absl::OkStatus();
}

// The requested outputs are among `available` (what this call produces); `other` names the
// model's outputs that another kind of call produces, for the message.
// Each requested output once; its parameters are those it takes (the classification extension:
// `classification` on a classifier's probabilities).
absl::Status CheckOutputs(const InferRequest& r, const ServedModel& m,
                          const std::vector<std::string>& available, const char* why_not) {
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    const RequestedOutput& o = r.outputs[i];
    const std::string name = o.name.substr(0, 64);
    if (std::find(available.begin(), available.end(), o.name) == available.end())
      return absl::InvalidArgumentError(
          absl::StrCat("output \"", name, "\": this request to model ", m.name(), " returns ",
                       absl::StrJoin(available, ", "), why_not));
    for (size_t j = 0; j < i; ++j)
      if (r.outputs[j].name == o.name)
        return absl::InvalidArgumentError(absl::StrCat("output ", name, " is asked for twice"));
    const bool classifies = o.name == "probabilities";
    for (const auto& [param, value] : o.parameters) {
      if (param == "classification" && classifies) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("output ", name, ": unknown parameter \"", param.substr(0, 64), "\" (",
                       classifies ? "it takes classification" : "it takes none", ")"));
    }
  }
  return absl::OkStatus();
}

const RequestedOutput* Requested(const InferRequest& r, const std::string& output) {
  for (const RequestedOutput& o : r.outputs)
    if (o.name == output) return &o;
  return nullptr;
}

bool Wanted(const InferRequest& r, const std::string& output) {
  return r.outputs.empty() || Requested(r, output) != nullptr;
}

// The classification extension: k when the probabilities output asks for its top k classes
// (1 to the model's classes), else 0.
absl::StatusOr<int64_t> ClassificationOf(const InferRequest& r, const ServedModel& m) {
  const RequestedOutput* o = Requested(r, "probabilities");
  if (o == nullptr) return 0;
  const auto it = o->parameters.find("classification");
  if (it == o->parameters.end()) return 0;
  auto k = IntegerParameter("classification", it->second);
  if (!k.ok()) return k.status();
  if (*k < 1 || *k > m.Classes())
    return absl::InvalidArgumentError(absl::StrCat("output probabilities: classification is ", *k,
                                                   "; it must be in [1, ", m.Classes(), "] (model ",
                                                   m.name(), " has ", m.Classes(), " classes)"));
  return *k;
}

// One class of the classification extension: "<value>:<index>[:<label>]", the value with 9
// significant digits (a float's exact text).
std::string ClassificationText(float value, int64_t index, const ModelInfo& info) {
  std::string out = absl::StrFormat("%.9g:%d", value, index);
  if (index < static_cast<int64_t>(info.labels.size()) && !info.labels[index].empty())
    absl::StrAppend(&out, ":", info.labels[index]);
  return out;
}

// The `image` input as [n, H, W, C] uint8: UINT8 [n, H, W, C] raw pixels, or BYTES [n] PNGs;
// 1 <= n <= the model's per-request limit, each image the model's shape.
absl::StatusOr<at::Tensor> ImagesOf(const Tensor& t, const ServedModel& m, const FaultHook& fault) {
  const ModelInfo& info = m.info();
  const ImageShape& s = info.shape;
  const std::string want = absl::StrCat("UINT8 [n, ", s.height, ", ", s.width, ", ", s.channels,
                                        "] or BYTES [n] (PNGs)");
  const bool png = t.datatype == DataType::kBytes;
  if (t.datatype != DataType::kUint8 && !png)
    return absl::InvalidArgumentError(absl::StrCat(
        "input image: datatype ", DataTypeName(t.datatype), "; model ", m.name(), " takes ", want));
  const size_t rank = png ? 1 : 4;
  if (t.shape.size() != rank ||
      (!png && (t.shape[1] != s.height || t.shape[2] != s.width || t.shape[3] != s.channels)))
    return absl::InvalidArgumentError(absl::StrCat("input image: shape ", ShapeString(t.shape),
                                                   "; model ", m.name(), " takes ", want));
  const int64_t n = t.shape[0];
  if (n < 1 || n > info.max_images_per_request)
    return absl::InvalidArgumentError(absl::StrCat("input image: ", n, " images; model ", m.name(),
                                                   " takes 1 to ", info.max_images_per_request,
                                                   " per request"));
  if (absl::Status st = CheckContents(t); !st.ok()) return st;
  if (!png) {
    at::Tensor out = at::empty({n, s.height, s.width, s.channels}, at::kByte);
    std::memcpy(out.data_ptr<uint8_t>(), t.data.data(), t.data.size());
    return out;
  }
  std::vector<at::Tensor> images;
  const std::vector<std::string_view> pngs = BytesElements(t);
  for (size_t i = 0; i < pngs.size(); ++i) {
    if (fault) fault("decode");
    auto d =
        DecodePngImage(pngs[i], absl::StrCat("input image[", i, "]"), ImageBounds{s, m.name()});
    if (!d.ok()) return d.status();
    images.push_back(*d);
  }
  return at::stack(images, 0).contiguous();
}

// class_index as one class row per element (-1: none), `n` of them when n >= 0.
absl::StatusOr<std::vector<int64_t>> ClassesOf(const Tensor& t, const ServedModel& m, int64_t n) {
  if (t.datatype != DataType::kInt32 && t.datatype != DataType::kInt64)
    return absl::InvalidArgumentError(absl::StrCat("input class_index: datatype ",
                                                   DataTypeName(t.datatype),
                                                   "; it must be INT32 (or INT64) [n]"));
  if (t.shape.size() != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("input class_index: shape ", ShapeString(t.shape), "; it must be [n]"));
  if (n >= 0 && t.shape[0] != n)
    return absl::InvalidArgumentError(absl::StrCat("input class_index: ", t.shape[0],
                                                   " classes for ", n, " images (one per image)"));
  if (absl::Status st = CheckContents(t); !st.ok()) return st;
  const int64_t count = t.shape[0];
  std::vector<int64_t> out(count, -1);
  for (int64_t i = 0; i < count; ++i) {
    int64_t v;
    if (t.datatype == DataType::kInt32) {
      int32_t x;
      std::memcpy(&x, t.data.data() + 4 * i, 4);
      v = x;
    } else {
      std::memcpy(&v, t.data.data() + 8 * i, 8);
    }
    if (v == -1) continue;
    auto row = m.ClassRow(false, "", v, absl::StrCat("input class_index[", i, "]"));
    if (!row.ok()) return absl::InvalidArgumentError(row.status().message());
    out[i] = *row;
  }
  return out;
}

Tensor RawOutput(const std::string& name, DataType type, std::vector<int64_t> shape,
                 const void* data, size_t bytes) {
  Tensor t;
  t.name = name;
  t.datatype = type;
  t.shape = std::move(shape);
  t.data.assign(static_cast<const char*>(data), bytes);
  return t;
}

InferResponse ResponseFor(const InferRequest& r, const ServedModel& m) {
  InferResponse out;
  out.model = m.name();
  out.version = std::to_string(m.info().version);
  out.id = r.id;
  return out;
}

// Hands `done` the response, or the error that replaced it.
void Answer(const InferDone& done, const absl::Status& st, InferResponse out) {
  if (st.ok()) {
    done(std::move(out));
  } else {
    done(st);
  }
}

// The request's `priority` parameter (Triton's: higher sooner; here 0 .. kMaxPriority within the
// caller's tenant, checked by CallBook::SetPriority under this name); 0 when absent.
constexpr char kPriorityField[] = "parameter priority";
absl::StatusOr<int64_t> PriorityParameter(const InferRequest& r) {
  const auto it = r.parameters.find("priority");
  if (it == r.parameters.end()) return 0;
  return IntegerParameter("priority", it->second);
}

CallLimits LimitsOf(const InferContext& ctx) {
  return CallLimits{ctx.deadline, ctx.cancelled, ctx.book->share()};
}

absl::Status Classify(const InferRequest& r, const ModelRef& m, const InferContext& ctx,
                      InferDone done) {
  if (absl::Status st = CheckParameterNames(r, *m, "a classifier", {"priority"}); !st.ok())
    return st;
  auto priority = PriorityParameter(r);
  if (!priority.ok()) return priority.status();
  // Set on the call's book before its limits are taken.
  if (absl::Status st = ctx.book->SetPriority(*priority, kPriorityField); !st.ok()) return st;
  if (absl::Status st = CheckOutputs(r, *m, {"probabilities", "label"}, ""); !st.ok()) return st;
  auto inputs = InputsByName(r, *m, {"image"});
  if (!inputs.ok()) return inputs.status();
  if (inputs->count("image") == 0)
    return absl::InvalidArgumentError(absl::StrCat("input image is missing: model ", m->name(),
                                                   " takes image UINT8 [n, H, W, C]"));
  auto images = ImagesOf(*inputs->at("image"), *m, ctx.edge->fault);
  if (!images.ok()) return images.status();
  auto top = ClassificationOf(r, *m);
  if (!top.ok()) return top.status();
  ctx.book->set_images(images->size(0));
  const bool probabilities = Wanted(r, "probabilities"), label = Wanted(r, "label");
  auto reply = [ctx, m, done, base = ResponseFor(r, *m), probabilities, label, top = *top](
                   absl::StatusOr<at::Tensor> probs, double queue_seconds) {
    if (queue_seconds > 0) ctx.book->Queued(queue_seconds);
    InferResponse out = base;
    const absl::Status st = Guarded(kRpc, [&]() -> absl::Status {
      ctx.edge->Fault("reply");
      if (!probs.ok()) return probs.status();
      const int64_t rows = probs->size(0), k = probs->size(1);
      const float* p = probs->data_ptr<float>();
      if (probabilities && top > 0) {  // the classification extension: BYTES [rows, top]
        Tensor t = RawOutput("probabilities", DataType::kBytes, {rows, top}, nullptr, 0);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t c : TopClasses(p + i * k, k, top))
            AppendBytesElement(ClassificationText(p[i * k + c], c, m->info()), &t.data);
        out.outputs.push_back(std::move(t));
      } else if (probabilities) {
        out.outputs.push_back(RawOutput("probabilities", DataType::kFp32, {rows, k}, p,
                                        static_cast<size_t>(rows * k) * sizeof(float)));
      }
      if (label) {
        Tensor t = RawOutput("label", DataType::kBytes, {rows}, nullptr, 0);
        for (int64_t i = 0; i < rows; ++i)  // the top-1 class, as krause.v1 Classify's first
          AppendBytesElement(ClassName(m->info(), TopClasses(p + i * k, k, 1)[0]), &t.data);
        out.outputs.push_back(std::move(t));
      }
      ctx.book->Served(rows);
      return absl::OkStatus();
    });
    Answer(done, st, std::move(out));
  };
  return m->Classify(*images, LimitsOf(ctx), ctx.edge->replies, std::move(reply));
}

absl::Status Score(const InferRequest& r, const ModelRef& m,
                   const std::map<std::string, const Tensor*>& inputs, const InferContext& ctx,
                   InferDone done) {
  if (absl::Status st = CheckParameterNames(r, *m, "scoring", {}); !st.ok()) return st;
  if (absl::Status st = CheckOutputs(r, *m, {"bits_per_dim"},
                                     " (images come from a request without an image input)");
      !st.ok())
    return st;
  auto images = ImagesOf(*inputs.at("image"), *m, ctx.edge->fault);
  if (!images.ok()) return images.status();
  const int64_t n = images->size(0);
  std::vector<int64_t> classes;
  if (inputs.count("class_index") > 0) {
    auto c = ClassesOf(*inputs.at("class_index"), *m, n);
    if (!c.ok()) return c.status();
    classes = std::move(*c);
  }
  ctx.book->set_images(n);
  auto reply = [ctx, m, done, base = ResponseFor(r, *m)](absl::StatusOr<std::vector<double>> bpd) {
    InferResponse out = base;
    const absl::Status st = Guarded(kRpc, [&]() -> absl::Status {
      ctx.edge->Fault("reply");
      if (!bpd.ok()) return bpd.status();
      const int64_t rows = static_cast<int64_t>(bpd->size());
      out.outputs.push_back(RawOutput("bits_per_dim", DataType::kFp64, {rows}, bpd->data(),
                                      bpd->size() * sizeof(double)));
      ctx.book->Served(rows);
      return absl::OkStatus();
    });
    Answer(done, st, std::move(out));
  };
  return m->Score(*images, std::move(classes), LimitsOf(ctx), ctx.edge->replies, std::move(reply));
}

absl::StatusOr<uint64_t> SeedParameter(const Parameter& p) {
  if (const auto* v = std::get_if<uint64_t>(&p)) return *v;
  auto i = IntegerParameter("seed", p);
  if (!i.ok()) return i.status();
  if (*i < 0) return absl::InvalidArgumentError(absl::StrCat("parameter seed is negative: ", *i));
  return static_cast<uint64_t>(*i);
}

// A generation answered once: the collector (edge/generation_collector.h) with the final output
// and the images as pixels, written as the images output [n, H, W, C].
class InferGeneration final : public GenerationCollector {
 public:
  InferGeneration(const InferContext& ctx, InferResponse base, InferDone done)
      : GenerationCollector(ctx.edge, ctx.book, /*png=*/false),
        base_(std::move(base)),
        done_(std::move(done)) {}
  absl::Status Start(ModelRef m, const GenerateSettings& g, Clock::time_point deadline,
                     std::function<bool()> cancelled) {
    return Submit(std::move(m), g, deadline, std::move(cancelled));
  }

 private:
  void WriteChunk(GenerateStream::Chunk& c, std::vector<EncodedImage> images) override {
    // The final output: one chunk, every image (in order) and the summary.
    const ImageShape& s = model().info().shape;
    const int64_t n = c.images_total, per_image = s.height * s.width * s.channels;
    out_ = base_;
    out_.outputs.push_back(
        RawOutput("images", DataType::kUint8, {n, s.height, s.width, s.channels}, nullptr, 0));
    std::string& data = out_.outputs.back().data;
    data.assign(static_cast<size_t>(n * per_image), '\0');
    for (const EncodedImage& im : images)
      std::copy(im.pixels.begin(), im.pixels.end(), data.begin() + im.image * per_image);
    WriteDone(true);
  }
  void EndCall(const absl::Status& st) override {
    Answer(done_,
           Guarded(kRpc,
                   [&] {
                     edge()->Fault("reply");
                     return st;
                   }),
           std::move(out_));
  }

  const InferResponse base_;
  const InferDone done_;
  InferResponse out_;  // the answer, once the images are in
};

absl::Status Generate(const InferRequest& r, const ModelRef& m,
                      const std::map<std::string, const Tensor*>& inputs, const InferContext& ctx,
                      InferDone done) {
  if (absl::Status st = CheckParameterNames(
          r, *m, "generating",
          {"num_images", "seed", "temperature", "top_p", "top_k", "guidance", "priority"});
      !st.ok())
    return st;
  if (absl::Status st = CheckOutputs(r, *m, {"images"},
                                     " (bits_per_dim comes from a request "
                                     "with an image input: scoring)");
      !st.ok())
    return st;
  const auto param = [&r](const char* name) -> const Parameter* {
    const auto it = r.parameters.find(name);
    return it == r.parameters.end() ? nullptr : &it->second;
  };
  // The parameters' and the class_index input's names, mapped to the settings here only.
  GenerateSettings g;
  g.answer_once = true;
  int64_t images = -1;
  if (const Parameter* v = param("num_images")) {
    auto n = IntegerParameter("num_images", *v);
    if (!n.ok()) return n.status();
    images = *n;
  }
  if (inputs.count("class_index") > 0) {
    auto c = ClassesOf(*inputs.at("class_index"), *m, images);
    if (!c.ok()) return c.status();
    g.image_classes = std::move(*c);
    images = static_cast<int64_t>(g.image_classes.size());
  }
  g.num_images = images == -1 ? 1 : images;
  if (absl::Status st = CheckImageCount(m->info(), g.num_images); !st.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(g.image_classes.empty() ? "parameter " : "input class_index: ", st.message()));
  for (auto [name, field] :
       {std::pair{"temperature", &g.temperature}, {"top_p", &g.top_p}, {"guidance", &g.guidance}}) {
    if (const Parameter* v = param(name)) {
      auto x = NumberParameter(name, *v);
      if (!x.ok()) return x.status();
      *field = *x;
    }
  }
  if (const Parameter* v = param("top_k")) {
    auto k = IntegerParameter("top_k", *v);
    if (!k.ok()) return k.status();
    g.top_k = *k;
  }
  auto priority = PriorityParameter(r);
  if (!priority.ok()) return priority.status();
  g.priority = *priority;
  g.priority_field = kPriorityField;
  if (const Parameter* v = param("seed")) {
    auto seed = SeedParameter(*v);
    if (!seed.ok()) return seed.status();
    g.seed = *seed;
  }
  auto call = std::make_shared<InferGeneration>(ctx, ResponseFor(r, *m), std::move(done));
  const absl::Status st = call->Start(m, g, ctx.deadline, ctx.cancelled);
  if (!st.ok() && absl::IsInvalidArgument(st))  // the model's defaults, as krause.v1's
    return absl::InvalidArgumentError(absl::StrCat("parameter ", st.message()));
  return st;
}

}  // namespace

ModelMetadata MetadataOf(const ServedModel& m, const std::vector<int64_t>& versions) {
  ModelMetadata md;
  md.name = m.name();
  for (int64_t v : versions) md.versions.push_back(std::to_string(v));
  md.platform = absl::StrCat("krause_", ModelKindName(m.kind()));
  const ImageShape& s = m.info().shape;
  const std::vector<int64_t> images = {-1, s.height, s.width, s.channels};
  if (m.kind() == ModelKind::kClassifier) {
    md.inputs = {{"image", DataType::kUint8, images}};
    md.outputs = {{"probabilities", DataType::kFp32, {-1, m.Classes()}},
                  {"label", DataType::kBytes, {-1}}};
  } else {
    // Without `image` the model generates; with it, it scores.
    md.inputs = {{"class_index", DataType::kInt32, {-1}}, {"image", DataType::kUint8, images}};
    md.outputs = {{"images", DataType::kUint8, images}, {"bits_per_dim", DataType::kFp64, {-1}}};
  }
  return md;
}

absl::StatusOr<ModelRef> FindModel(const Registry& registry, const std::string& name,
                                   const std::string& version) {
  if (name.empty()) return absl::InvalidArgumentError("model_name is required");
  return registry.FindAny(name, version);
}

absl::Status StartInfer(const Registry& registry, InferRequest request, InferContext ctx,
                        InferDone done) {
  auto found = FindModel(registry, request.model, request.version);
  if (!found.ok()) return found.status();
  const ModelRef& m = *found;
  // The request's own deadline (Triton's `timeout` parameter, in microseconds), within the call's.
  if (auto t = request.parameters.find("timeout"); t != request.parameters.end()) {
    auto us = IntegerParameter("timeout", t->second);
    if (!us.ok()) return us.status();
    if (*us < 0 || *us > kMaxTimeoutMicroseconds)
      return absl::InvalidArgumentError(absl::StrCat("parameter timeout is ", *us,
                                                     " us; it must be in [0, ",
                                                     kMaxTimeoutMicroseconds, "] (0: none)"));
    if (*us > 0)
      ctx.deadline = std::min(ctx.deadline, ctx.book->start() + std::chrono::microseconds(*us));
    request.parameters.erase(t);
  }
  ctx.book->set_model(m);  // the book keeps the model for the call's life
  if (m->kind() == ModelKind::kClassifier) return Classify(request, m, ctx, std::move(done));
  auto inputs = InputsByName(request, *m, {"class_index", "image"});
  if (!inputs.ok()) return inputs.status();
  if (inputs->count("image") > 0) return Score(request, m, *inputs, ctx, std::move(done));
  return Generate(request, m, *inputs, ctx, std::move(done));
}

}  // namespace krause::server::oip
