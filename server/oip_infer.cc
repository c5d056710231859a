#include "server/oip_infer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/images.h"
#include "server/served_classifier.h"
#include "server/served_generator.h"
#include "server/status.h"

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
absl::Status CheckOutputs(const InferRequest& r, const ServedModel& m,
                          const std::vector<std::string>& available, const char* why_not) {
  for (const std::string& name : r.outputs) {
    if (std::find(available.begin(), available.end(), name) != available.end()) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("output \"", name.substr(0, 64), "\": this request to model ", m.name(),
                     " returns ", absl::StrJoin(available, ", "), why_not));
  }
  return absl::OkStatus();
}

bool Wanted(const InferRequest& r, const std::string& output) {
  return r.outputs.empty() ||
         std::find(r.outputs.begin(), r.outputs.end(), output) != r.outputs.end();
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
absl::StatusOr<std::vector<int64_t>> ClassesOf(const Tensor& t, const ServedGenerator& m,
                                               int64_t n) {
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
    auto row = v < -1 ? absl::InvalidArgumentError(absl::StrCat("class ", v, " is below -1 (none)"))
                      : m.config().ClassRow(v);
    if (!row.ok())
      return absl::InvalidArgumentError(absl::StrCat("input class_index[", i, "]: model ", m.name(),
                                                     ": ", row.status().message()));
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

void Report(const InferContext& ctx, const ServedModel& m, int64_t n) {
  if (ctx.observer == nullptr) return;
  ctx.observer->OnFlops(kRpc, m.name(), m.flops().executed_flops * static_cast<double>(n),
                        m.flops().dense_equivalent_flops * static_cast<double>(n));
  ctx.observer->OnImages(kRpc, m.name(), n);
}

absl::Status Classify(const InferRequest& r, ServedClassifier* m, const InferContext& ctx,
                      InferDone done) {
  if (absl::Status st = CheckParameterNames(r, *m, "a classifier", {}); !st.ok()) return st;
  if (absl::Status st = CheckOutputs(r, *m, {"probabilities", "label"}, ""); !st.ok()) return st;
  auto inputs = InputsByName(r, *m, {"image"});
  if (!inputs.ok()) return inputs.status();
  if (inputs->count("image") == 0)
    return absl::InvalidArgumentError(absl::StrCat("input image is missing: model ", m->name(),
                                                   " takes image UINT8 [n, H, W, C]"));
  auto images = ImagesOf(*inputs->at("image"), *m, ctx.fault);
  if (!images.ok()) return images.status();
  const int64_t n = images->size(0);
  ctx.book->set_images(n);
  ClassifyJob job;
  job.images = images->permute({0, 3, 1, 2}).contiguous();
  job.deadline = ctx.deadline;
  job.cancelled = ctx.cancelled;
  const bool probabilities = Wanted(r, "probabilities"), label = Wanted(r, "label");
  auto reply = [ctx, m, done, base = ResponseFor(r, *m), probabilities, label](
                   absl::StatusOr<at::Tensor> probs, double queue_seconds) {
    if (ctx.observer && queue_seconds > 0) ctx.observer->OnQueued(kRpc, m->name(), queue_seconds);
    ctx.book->NoteQueued(queue_seconds);
    InferResponse out = base;
    const absl::Status st = Guarded(kRpc, [&]() -> absl::Status {
      if (ctx.fault) ctx.fault("reply");
      if (!probs.ok()) return probs.status();
      const int64_t rows = probs->size(0), k = probs->size(1);
      const float* p = probs->data_ptr<float>();
      if (probabilities)
        out.outputs.push_back(RawOutput("probabilities", DataType::kFp32, {rows, k}, p,
                                        static_cast<size_t>(rows * k) * sizeof(float)));
      if (label) {
        Tensor t = RawOutput("label", DataType::kBytes, {rows}, nullptr, 0);
        const std::vector<std::string>& names = m->config().labels;
        for (int64_t i = 0; i < rows; ++i) {
          // The first of the highest (native Classify's top-1 on ties).
          const float* row = p + i * k;
          const int64_t best = std::max_element(row, row + k) - row;
          AppendBytesElement(
              best < static_cast<int64_t>(names.size()) ? names[best] : std::to_string(best),
              &t.data);
        }
        out.outputs.push_back(std::move(t));
      }
      Report(ctx, *m, rows);
      return absl::OkStatus();
    });
    Answer(done, st, std::move(out));
  };
  // As native Classify: with requests queued, the reply is built on the reply pool so that the
  // next batch starts at once; with none, the batcher replies itself.
  job.done = [reply = std::move(reply), replies = ctx.replies, batcher = &m->batcher()](
                 absl::StatusOr<at::Tensor> probs, double queue_s) {
    if (batcher->queued_images() == 0) {
      reply(std::move(probs), queue_s);
      return;
    }
    replies->Post([reply, probs = std::move(probs), queue_s] { reply(probs, queue_s); });
  };
  return m->batcher().Enqueue(std::move(job));
}

absl::Status Score(const InferRequest& r, ServedGenerator* m,
                   const std::map<std::string, const Tensor*>& inputs, const InferContext& ctx,
                   InferDone done) {
  if (absl::Status st = CheckParameterNames(r, *m, "scoring", {}); !st.ok()) return st;
  if (absl::Status st = CheckOutputs(r, *m, {"bits_per_dim"},
                                     " (images come from a request without an image input)");
      !st.ok())
    return st;
  auto images = ImagesOf(*inputs.at("image"), *m, ctx.fault);
  if (!images.ok()) return images.status();
  const int64_t n = images->size(0);
  ScoreJob job;
  if (inputs.count("class_index") > 0) {
    auto classes = ClassesOf(*inputs.at("class_index"), *m, n);
    if (!classes.ok()) return classes.status();
    job.labels = std::move(*classes);
  }
  ctx.book->set_images(n);
  job.images = images->reshape({n, -1});  // HWC raster order
  job.deadline = ctx.deadline;
  job.cancelled = ctx.cancelled;
  job.done = [ctx, m, done, base = ResponseFor(r, *m)](absl::StatusOr<std::vector<double>> bpd) {
    ctx.replies->Post([ctx, m, done, base, bpd = std::move(bpd)] {
      InferResponse out = base;
      const absl::Status st = Guarded(kRpc, [&]() -> absl::Status {
        if (ctx.fault) ctx.fault("reply");
        if (!bpd.ok()) return bpd.status();
        const int64_t rows = static_cast<int64_t>(bpd->size());
        out.outputs.push_back(RawOutput("bits_per_dim", DataType::kFp64, {rows}, bpd->data(),
                                        bpd->size() * sizeof(double)));
        Report(ctx, *m, rows);
        return absl::OkStatus();
      });
      Answer(done, st, std::move(out));
    });
  };
  return m->worker().EnqueueScore(std::move(job));
}

// One generation's receiver: collects the images' subpixels into the output tensor, stops them
// at the deadline or when the caller leaves, and hands the response to the reply pool when the
// last image is done.
class Collector final : public GenerationReceiver, public std::enable_shared_from_this<Collector> {
 public:
  Collector(ServedGenerator* m, const InferContext& ctx, InferResponse base, int64_t images,
            InferDone done)
      : m_(m), ctx_(ctx), out_(std::move(base)), done_(std::move(done)), status_(images) {
    const ImageShape& s = m->info().shape;
    out_.outputs.push_back(
        RawOutput("images", DataType::kUint8, {images, s.height, s.width, s.channels}, nullptr, 0));
    per_image_ = s.height * s.width * s.channels;
    out_.outputs[0].data.assign(static_cast<size_t>(images * per_image_), '\0');
    left_ = images;
  }

  void OnUpdate(const CallUpdate& u) override {  // worker thread
    std::string& data = out_.outputs[0].data;
    for (const CallUpdate::Pixel& p : u.pixels)
      data[static_cast<size_t>(p.image * per_image_ + p.index)] = static_cast<char>(p.value);
    for (size_t i = 0; i < u.admitted.size(); ++i) {
      const double wait = std::chrono::duration<double>(u.admitted_at - ctx_.book->start()).count();
      ctx_.book->NoteQueued(wait);
      if (ctx_.observer) ctx_.observer->OnQueued(kRpc, m_->name(), wait);
    }
    for (const CallUpdate::Done& d : u.done) {
      status_[d.image] = d.status;
      --left_;
    }
    stopping_ = stopping_ || u.stopping;
    if (left_ > 0 && !stopped_) {
      if (u.now >= ctx_.deadline) {
        stopped_ = true;
        why_ = absl::DeadlineExceededError("deadline exceeded; generation stopped");
      } else if (ctx_.cancelled && ctx_.cancelled()) {
        stopped_ = true;
        why_ = absl::CancelledError("cancelled by the client");
      }
      if (stopped_) m_->worker().Cancel(this);
    }
    if (left_ > 0) return;
    ctx_.replies->Post([self = shared_from_this()] { self->Finish(); });
  }

 private:
  void Finish() {  // reply pool, once
    absl::Status st = Guarded(kRpc, [&]() -> absl::Status {
      if (ctx_.fault) ctx_.fault("reply");
      for (const absl::Status& s : status_) {
        if (s.ok()) continue;
        if (!why_.ok()) return why_;
        if (stopping_)
          return Refusal("the server is shutting down; generation was cancelled",
                         reason::kDraining);
        return s;
      }
      Report(ctx_, *m_, static_cast<int64_t>(status_.size()));
      return absl::OkStatus();
    });
    Answer(done_, st, std::move(out_));
  }

  ServedGenerator* const m_;
  const InferContext ctx_;
  InferResponse out_;
  const InferDone done_;
  int64_t per_image_ = 0;
  // Worker thread only (then the reply pool, after the last update).
  std::vector<absl::Status> status_;
  int64_t left_ = 0;
  bool stopped_ = false, stopping_ = false;
  absl::Status why_;
};

absl::StatusOr<uint64_t> SeedParameter(const Parameter& p) {
  if (const auto* v = std::get_if<uint64_t>(&p)) return *v;
  auto i = IntegerParameter("seed", p);
  if (!i.ok()) return i.status();
  if (*i < 0) return absl::InvalidArgumentError(absl::StrCat("parameter seed is negative: ", *i));
  return static_cast<uint64_t>(*i);
}

absl::Status Generate(const InferRequest& r, ServedGenerator* m,
                      const std::map<std::string, const Tensor*>& inputs, const InferContext& ctx,
                      InferDone done) {
  if (absl::Status st = CheckParameterNames(
          r, *m, "generating", {"num_images", "seed", "temperature", "top_p", "top_k", "guidance"});
      !st.ok())
    return st;
  if (absl::Status st = CheckOutputs(r, *m, {"images"},
                                     " (bits_per_dim comes from a request "
                                     "with an image input: scoring)");
      !st.ok())
    return st;
  const ModelInfo& info = m->info();
  GenerateParams p;
  const auto param = [&r](const char* name) -> const Parameter* {
    const auto it = r.parameters.find(name);
    return it == r.parameters.end() ? nullptr : &it->second;
  };
  int64_t images = -1;
  if (const Parameter* v = param("num_images")) {
    auto n = IntegerParameter("num_images", *v);
    if (!n.ok()) return n.status();
    images = *n;
  }
  std::vector<int64_t> classes;
  if (inputs.count("class_index") > 0) {
    auto c = ClassesOf(*inputs.at("class_index"), *m, images);
    if (!c.ok()) return c.status();
    classes = std::move(*c);
    images = static_cast<int64_t>(classes.size());
  }
  if (images == -1) images = 1;
  if (images < 1 || images > info.max_images_per_request)
    return absl::InvalidArgumentError(
        absl::StrCat(classes.empty() ? "parameter num_images" : "input class_index", ": ", images,
                     " images; model ", m->name(), " generates 1 to ", info.max_images_per_request,
                     " per request"));
  p.images = images;
  // Parameters left out get the model's defaults (ModelInfo), as in native Generate.
  SamplingParams& sp = p.sampling;
  sp.temperature = info.default_temperature.value_or(sp.temperature);
  sp.top_p = info.default_top_p.value_or(sp.top_p);
  sp.top_k = info.default_top_k.value_or(sp.top_k);
  for (auto [name, field] : {std::pair{"temperature", &sp.temperature}, {"top_p", &sp.top_p}}) {
    if (const Parameter* v = param(name)) {
      auto x = NumberParameter(name, *v);
      if (!x.ok()) return x.status();
      *field = *x;
    }
  }
  if (const Parameter* v = param("top_k")) {
    auto k = IntegerParameter("top_k", *v);
    if (!k.ok()) return k.status();
    sp.top_k = *k;
  }
  if (absl::Status st = ValidateSampling(sp); !st.ok())
    return absl::InvalidArgumentError(absl::StrCat("parameter ", st.message()));
  const bool guidance_given = param("guidance") != nullptr;
  if (const Parameter* v = param("guidance")) {
    auto g = NumberParameter("guidance", *v);
    if (!g.ok()) return g.status();
    p.guidance = *g;
  }
  if (classes.empty()) classes.assign(images, -1);
  // Without the parameter, an image with a class gets the model's default guidance, one without
  // none (as native Generate).
  std::vector<double> guidance(images, p.guidance);
  if (!guidance_given)
    for (int64_t i = 0; i < images; ++i)
      guidance[i] = classes[i] >= 0 ? info.default_guidance.value_or(1.0) : 1.0;
  for (int64_t i = 0; i < images; ++i) {
    if (absl::Status st = ValidateGuidance(guidance[i], classes[i]); !st.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter guidance: ", st.message(),
          classes[i] >= 0 ? "" : absl::StrCat("; image ", i, " has no class (class_index)")));
  }
  if (const Parameter* v = param("seed")) {
    auto seed = SeedParameter(*v);
    if (!seed.ok()) return seed.status();
    sp.seed = *seed;
  } else {
    sp.seed = std::random_device{}() * 0x100000001ull;
  }
  std::vector<GenerationRequest> requests = ImageRequests(p);
  for (int64_t i = 0; i < images; ++i) {
    requests[i].label = classes[i];
    requests[i].guidance = guidance[i];
  }
  ctx.book->set_images(images);
  auto collector = std::make_shared<Collector>(m, ctx, ResponseFor(r, *m), images, std::move(done));
  return m->worker().Submit(std::move(requests), std::move(collector));
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
    md.outputs = {{"probabilities",
                   DataType::kFp32,
                   {-1, static_cast<const ServedClassifier&>(m).config().classes}},
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

absl::Status StartInfer(const Registry& registry, InferRequest request, const InferContext& ctx,
                        InferDone done) {
  auto found = FindModel(registry, request.model, request.version);
  if (!found.ok()) return found.status();
  ServedModel* m = found->get();
  ctx.book->set_model(*found);  // the book keeps the model for the call's life
  if (m->kind() == ModelKind::kClassifier)
    return Classify(request, static_cast<ServedClassifier*>(m), ctx, std::move(done));
  auto* g = static_cast<ServedGenerator*>(m);
  auto inputs = InputsByName(request, *m, {"class_index", "image"});
  if (!inputs.ok()) return inputs.status();
  if (inputs->count("image") > 0) return Score(request, g, *inputs, ctx, std::move(done));
  return Generate(request, g, *inputs, ctx, std::move(done));
}

}  // namespace krause::server::oip
