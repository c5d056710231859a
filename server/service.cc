#include "server/service.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "model/data/png.h"
#include "server/generate_stream.h"
#include "server/images.h"
#include "server/model_info_proto.h"
#include "server/status.h"

namespace krause::server {
namespace {

using Clock = std::chrono::steady_clock;

// The call's deadline on the steady clock (max when it has none).
Clock::time_point SteadyDeadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  const auto left = d - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

// A unary call on the default reactor.
class UnaryCall {
 public:
  UnaryCall(KrauseService* svc, grpc::CallbackServerContext* ctx, const char* rpc)
      : book_(svc->gate(), svc->observer(), svc->request_log(), rpc),
        reactor_(ctx->DefaultReactor()) {}

  // Enters the gate; on refusal finishes the call and returns false.
  bool Enter(grpc::CallbackServerContext* ctx) {
    const absl::Status st = book_.Enter(ctx);
    if (!st.ok()) Finish(st);
    return st.ok();
  }
  void set_model(const std::string& m) { book_.set_model(m); }
  void set_images(int64_t n) { book_.set_images(n); }
  void NoteQueued(double seconds) { book_.NoteQueued(seconds); }
  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  void Finish(const absl::Status& st) { book_.Finish(reactor_, st); }

 private:
  CallBook book_;
  grpc::ServerUnaryReactor* reactor_;
};

// Decodes request images of one model into [n, C, H, W] uint8.
absl::StatusOr<at::Tensor> DecodeBatch(const google::protobuf::RepeatedPtrField<v1::Image>& images,
                                       const ServedModel& m, const KrauseService& svc) {
  if (images.empty()) return absl::InvalidArgumentError("images is empty (send 1 or more images)");
  if (images.size() > m.info.max_images_per_request)
    return absl::InvalidArgumentError(absl::StrCat("images has ", images.size(), " images; model ",
                                                   m.spec.name, " takes at most ",
                                                   m.info.max_images_per_request, " per request"));
  std::vector<at::Tensor> out;
  out.reserve(images.size());
  for (int i = 0; i < images.size(); ++i) {
    const std::string field = absl::StrCat("images[", i, "]");
    svc.Fault("decode");
    auto t = DecodeImage(images[i], field, ImageBounds{m.info.shape, m.spec.name});
    if (!t.ok()) return t.status();
    out.push_back(t->permute({2, 0, 1}));
  }
  return at::stack(out, 0).contiguous();
}

struct ResolvedCall {
  ServedModel* model = nullptr;
  at::Tensor images;  // [n, C, H, W] uint8
};

// The common start of Classify and Score (after the gate): find the model of `kind`, decode the
// images.
absl::StatusOr<ResolvedCall> ResolveImageCall(
    UnaryCall* call, const KrauseService& svc, const std::string& model, ModelKind kind,
    const google::protobuf::RepeatedPtrField<v1::Image>& images) {
  auto found = svc.gate()->registry()->Find(model, kind);
  if (!found.ok()) return found.status();
  call->set_model((*found)->spec.name);
  call->set_images(images.size());
  auto decoded = DecodeBatch(images, **found, svc);
  if (!decoded.ok()) return decoded.status();
  return ResolvedCall{*found, *decoded};
}

// Score's per-image classes: empty (none), or one per image from `labels` or `class_indices`
// ("" and -1: that image without a class). InvalidArgument naming the field and entry.
absl::StatusOr<std::vector<int64_t>> ScoreClasses(const v1::ScoreRequest& req,
                                                  const PixelModelConfig& c,
                                                  const std::string& model, int64_t n) {
  const int64_t by_name = req.labels_size(), by_index = req.class_indices_size();
  if (by_name == 0 && by_index == 0) return std::vector<int64_t>();
  if (by_name > 0 && by_index > 0)
    return absl::InvalidArgumentError("labels and class_indices: give at most one of the two");
  const char* field = by_name > 0 ? "labels" : "class_indices";
  if (std::max(by_name, by_index) != n) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", std::max(by_name, by_index),
                                                   " entries for ", n, " images (one per image)"));
  }
  std::vector<int64_t> out(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    absl::StatusOr<int64_t> cls = -1;
    if (by_name > 0 && !req.labels(i).empty()) {
      cls = c.ClassOfLabel(req.labels(i));
    } else if (by_index > 0 && req.class_indices(i) != -1) {
      cls = req.class_indices(i) < -1 ? absl::InvalidArgumentError(absl::StrCat(
                                            "class ", req.class_indices(i), " is below -1 (none)"))
                                      : c.ClassRow(req.class_indices(i));
    }
    if (!cls.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: model ", model, ": ", cls.status().message()));
    }
    out[i] = *cls;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Generate: the stream's state lives in a shared object that the engine callbacks, the worker's
// step listener and the reactor all hold; the reactor itself is only touched to start a write or
// to finish, and only before Finish.

class GenerateCall;

// Carries out a GenerateStream (generate_stream.h) for one call: engine callbacks and the reactor
// feed it events under mu_; what it decides is done here outside the lock (cancelling engine
// requests, encoding PNGs, building the proto message, writing, finishing).
class GenerateState : public StepListener, public std::enable_shared_from_this<GenerateState> {
 public:
  GenerateState(KrauseService* svc, ServedModel* model, GenerateCall* reactor,
                GenerateStream::Options options)
      : svc_(svc), model_(model), reactor_(reactor), stream_(std::move(options)) {}

  double max_queued_seconds() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stream_.max_queued_seconds();
  }
  void SetIds(std::vector<int64_t> ids) {
    std::lock_guard<std::mutex> lock(mu_);
    ids_ = std::move(ids);
  }

  // Engine thread: an image got its cache slot; its wait is the call's queue time.
  void OnAdmitted(int64_t image) {
    double waited;
    {
      std::lock_guard<std::mutex> lock(mu_);
      waited = stream_.Admitted(image, Clock::now());
    }
    if (CallObserver* obs = svc_->observer()) obs->OnQueued("Generate", model_->spec.name, waited);
  }
  void OnPixel(int64_t image, int64_t index, uint8_t value) {
    std::lock_guard<std::mutex> lock(mu_);
    stream_.Pixel(image, index, value, Clock::now());
  }
  void OnDone(int64_t image, absl::Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    stream_.Done(image, std::move(st));
  }

  // Engine thread, after each step. Building and sending happen on the reply pool: here only
  // whether a flush is worth posting (one at a time; a write in flight flushes again when done).
  bool AfterStep() override {
    const Clock::time_point now = Clock::now();
    std::vector<int64_t> cancel;
    bool post, more;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stream_.DeadlinePassed(now)) cancel = ids_;
      post = stream_.ShouldPostFlush(now);
      more = stream_.WantsSteps();
    }
    for (int64_t id : cancel) model_->generator->Cancel(id);
    if (post) svc_->replies()->Post([self = shared_from_this()] { self->Flush(); });
    return more;
  }

  void ClientCancelled() {
    std::vector<int64_t> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_.ClientCancelled();
      ids = ids_;
    }
    for (int64_t id : ids) model_->generator->Cancel(id);
  }

  void WriteDone(bool ok) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_.WriteDone(ok);
    }
    Flush();
  }

  // Sends what is due, or finishes the call once every image is done and the last message has
  // gone. Runs on the reply pool (posted after engine steps) and on gRPC's thread in OnWriteDone;
  // PNGs are encoded outside the lock, so the engine thread's OnPixel never waits on one.
  void Flush();

 private:
  void FlushOnce();
  // The chunk as the proto message (PNG-encoding its finished images).
  void BuildMessage(GenerateStream::Chunk& chunk);

  KrauseService* const svc_;
  ServedModel* const model_;
  GenerateCall* const reactor_;

  mutable std::mutex mu_;
  GenerateStream stream_;
  std::vector<int64_t> ids_;
  v1::GenerateResponse message_;  // the message being written (one write at a time)
};

class GenerateCall : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateCall(KrauseService* svc, grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req)
      : svc_(svc), book_(svc->gate(), svc->observer(), svc->request_log(), "Generate") {
    absl::Status st = book_.Enter(ctx);
    if (st.ok()) st = Guarded("Generate", [&] { return Start(ctx, *req); });
    if (!st.ok()) FinishCall(st);
  }

  void OnWriteDone(bool ok) override { state_->WriteDone(ok); }
  void OnCancel() override {
    if (state_) state_->ClientCancelled();
  }
  void OnDone() override { delete this; }

  // Finishes exactly once (GenerateState guarantees it for the streaming part).
  void FinishCall(const absl::Status& st) {
    if (state_) book_.NoteQueued(state_->max_queued_seconds());
    book_.Finish(this, st);
  }

 private:
  absl::Status Start(grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req);

  KrauseService* const svc_;
  CallBook book_;
  std::shared_ptr<GenerateState> state_;
};

void GenerateState::Flush() {
  const absl::Status st = Guarded("Generate", [&] {
    FlushOnce();
    return absl::OkStatus();
  });
  if (st.ok()) return;
  // The flush threw before its write started (StartWrite is its last step): the images still
  // running stop, and the call ends with the error.
  std::vector<int64_t> ids;
  bool finish;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finish = stream_.Fail(st);
    if (finish) ids = ids_;
  }
  for (int64_t id : ids) model_->generator->Cancel(id);
  if (finish) reactor_->FinishCall(st);
}

void GenerateState::FlushOnce() {
  svc_->Fault("flush");
  GenerateStream::Action a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    a = stream_.Flush(Clock::now(), model_->generator->stopping());
  }
  if (a.kind == GenerateStream::Action::kFinish) {
    reactor_->FinishCall(a.status);
    return;
  }
  if (a.kind != GenerateStream::Action::kWrite) return;
  GenerateStream::Chunk& c = a.chunk;
  if (CallObserver* obs = svc_->observer()) {
    obs->OnStreamChunk(model_->spec.name, c.first, c.seconds_since_previous);
    if (c.has_summary) {
      obs->OnFlops("Generate", model_->spec.name, c.summary.flops_executed,
                   c.summary.flops_dense_equivalent);
      obs->OnImages("Generate", model_->spec.name, c.summary.images);
    }
  }
  // message_ is this flush's alone until StartWrite: the stream writes one chunk at a time.
  BuildMessage(c);
  reactor_->StartWrite(&message_);
}

void GenerateState::BuildMessage(GenerateStream::Chunk& c) {
  message_.Clear();
  v1::GenerateProgress* p = message_.mutable_progress();
  p->set_pixels_done(static_cast<uint64_t>(c.pixels_done));
  p->set_pixels_total(static_cast<uint64_t>(c.pixels_total));
  p->set_images_done(static_cast<uint32_t>(c.images_done));
  p->set_images_total(static_cast<uint32_t>(c.images_total));
  p->set_waiting(static_cast<uint32_t>(c.waiting));
  for (GenerateStream::Rows& r : c.rows) {
    v1::ImageRows* m = message_.add_rows();
    m->set_image(static_cast<uint32_t>(r.image));
    m->set_first_row(static_cast<uint32_t>(r.first_row));
    m->set_num_rows(static_cast<uint32_t>(r.num_rows));
    m->set_pixels(r.pixels.data(), r.pixels.size());
  }
  const ImageShape& shape = model_->info.shape;
  for (GenerateStream::FinishedImage& im : c.images) {
    const at::Tensor hwc =
        at::from_blob(im.pixels.data(), {shape.height, shape.width, shape.channels}, at::kByte);
    auto png = EncodePng(hwc);
    if (!png.ok()) {  // the call ends with this error after the message
      std::lock_guard<std::mutex> lock(mu_);
      stream_.EncodeFailed(im.image, absl::InternalError(absl::StrCat("PNG encoding failed: ",
                                                                      png.status().message())));
      continue;
    }
    v1::GeneratedImage* g = message_.add_images();
    g->set_image(static_cast<uint32_t>(im.image));
    g->set_seed(im.seed);
    g->set_png(std::move(*png));
  }
  if (c.has_summary) {
    v1::GenerateSummary* s = message_.mutable_summary();
    s->set_model(model_->spec.name);
    s->set_images(static_cast<uint32_t>(c.summary.images));
    s->set_pixels_generated(static_cast<uint64_t>(c.summary.pixels_generated));
    s->set_seconds(c.summary.seconds);
    s->set_seconds_to_first_pixel(c.summary.seconds_to_first_pixel);
    s->set_seed(c.summary.seed);
    s->set_flops_executed(c.summary.flops_executed);
    s->set_flops_dense_equivalent(c.summary.flops_dense_equivalent);
  }
}

absl::Status GenerateCall::Start(grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req) {
  auto found = svc_->gate()->registry()->Find(req.model(), ModelKind::kGenerator);
  if (!found.ok()) return found.status();
  ServedModel* m = *found;
  book_.set_model(m->spec.name);
  const int64_t n = req.num_images() == 0 ? 1 : req.num_images();
  if (n > m->info.max_images_per_request)
    return absl::InvalidArgumentError(absl::StrCat("num_images is ", n, "; model ", m->spec.name,
                                                   " allows at most ",
                                                   m->info.max_images_per_request, " per request"));
  SamplingParams sp;
  if (req.has_temperature()) sp.temperature = req.temperature();
  if (req.has_top_p()) sp.top_p = req.top_p();
  sp.top_k = req.top_k();
  absl::Status st = ValidateSampling(sp);
  if (!st.ok()) return st;
  const int64_t interval = req.update_interval_ms() == 0 ? 100 : req.update_interval_ms();
  if (interval < 10 || interval > 10000)
    return absl::InvalidArgumentError(
        absl::StrCat("update_interval_ms must be 0 (100) or in [10, 10000], got ", interval));
  std::vector<uint8_t> prompt;
  if (req.has_prompt()) {
    svc_->Fault("decode");
    auto t = DecodeImage(req.prompt(), "prompt",
                         ImageBounds{m->info.shape, m->spec.name, /*prompt=*/true});
    if (!t.ok()) return t.status();
    const int64_t rows = req.prompt_rows();
    if (rows < 1 || rows >= m->info.shape.height)
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt_rows must be in [1, ", m->info.shape.height - 1, "] with a prompt, got ", rows));
    if (rows > t->size(0))
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt_rows is ", rows, " but the prompt image has only ", t->size(0), " rows"));
    const at::Tensor kept = t->narrow(0, 0, rows).contiguous();
    prompt.assign(kept.data_ptr<uint8_t>(), kept.data_ptr<uint8_t>() + kept.numel());
  } else if (req.prompt_rows() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_rows is ", req.prompt_rows(), " but there is no prompt"));
  }
  int64_t label = -1;
  if (req.condition_case() != v1::GenerateRequest::CONDITION_NOT_SET) {
    const PixelModelConfig& c = m->model.pixel->config();
    const bool by_name = req.condition_case() == v1::GenerateRequest::kLabel;
    auto cls = by_name ? c.ClassOfLabel(req.label()) : c.ClassRow(req.class_index());
    if (!cls.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(by_name ? "label" : "class_index", ": model ",
                                                     m->spec.name, ": ", cls.status().message()));
    }
    label = *cls;
  }
  const double guidance = req.has_guidance() ? req.guidance() : 1.0;
  if (const absl::Status st = ValidateGuidance(guidance, label); !st.ok()) {
    if (label >= 0) return st;  // the range
    return absl::InvalidArgumentError(absl::StrCat(st.message(), "; model ", m->spec.name,
                                                   m->model.pixel->config().conditional()
                                                       ? " was given none (label or class_index)"
                                                       : " is unconditional"));
  }
  uint64_t seed = req.has_seed() ? req.seed() : std::random_device{}() * 0x100000001ull;
  GenerateStream::Options so;
  so.shape = m->info.shape;
  so.images = n;
  so.prompt = prompt;
  so.seed = seed;
  so.passes = GenerationRequest::SlotsFor(guidance);
  so.cost = m->flops;
  so.start = book_.start();
  so.deadline = SteadyDeadline(ctx);
  so.interval = std::chrono::milliseconds(interval);
  so.stream_rows = !req.has_stream_rows() || req.stream_rows();
  state_ = std::make_shared<GenerateState>(svc_, m, this, std::move(so));
  book_.set_images(n);
  std::vector<GenerationRequest> requests(n);
  for (int64_t i = 0; i < n; ++i) {
    GenerationRequest& r = requests[i];
    r.prompt = prompt;
    r.sampling = sp;
    r.sampling.seed = seed + static_cast<uint64_t>(i);
    r.label = label;
    r.guidance = guidance;
    std::shared_ptr<GenerateState> s = state_;
    r.on_pixel = [s, i](int64_t index, uint8_t v) { s->OnPixel(i, index, v); };
    r.on_admitted = [s, i] { s->OnAdmitted(i); };
    r.on_done = [s, i](absl::Status status, std::vector<uint8_t>) {
      s->OnDone(i, std::move(status));
    };
  }
  auto ids = m->generator->Submit(std::move(requests));
  if (!ids.ok()) return ids.status();
  state_->SetIds(std::move(*ids));
  m->generator->AddListener(state_);
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Handlers

grpc::ServerUnaryReactor* KrauseService::ListModels(grpc::CallbackServerContext* ctx,
                                                    const v1::ListModelsRequest*,
                                                    v1::ListModelsResponse* response) {
  UnaryCall call(this, ctx, "ListModels");
  if (!call.Enter(ctx)) return call.reactor();
  call.Finish(Guarded("ListModels", [&] {
    for (const auto& m : gate_->registry()->models()) *response->add_models() = ToProto(m->info);
    return absl::OkStatus();
  }));
  return call.reactor();
}

grpc::ServerUnaryReactor* KrauseService::GetModel(grpc::CallbackServerContext* ctx,
                                                  const v1::GetModelRequest* request,
                                                  v1::ModelInfo* response) {
  UnaryCall call(this, ctx, "GetModel");
  if (!call.Enter(ctx)) return call.reactor();
  call.Finish(Guarded("GetModel", [&]() -> absl::Status {
    if (request->name().empty()) return absl::InvalidArgumentError("name is required");
    auto m = gate_->registry()->FindAny(request->name());
    if (!m.ok()) return m.status();
    call.set_model((*m)->spec.name);
    *response = ToProto((*m)->info);
    return absl::OkStatus();
  }));
  return call.reactor();
}

grpc::ServerUnaryReactor* KrauseService::Classify(grpc::CallbackServerContext* ctx,
                                                  const v1::ClassifyRequest* request,
                                                  v1::ClassifyResponse* response) {
  auto call = std::make_shared<UnaryCall>(this, ctx, "Classify");
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(ctx)) return reactor;
  const absl::Status st = Guarded("Classify", [&]() -> absl::Status {
    auto resolved = ResolveImageCall(call.get(), *this, request->model(), ModelKind::kClassifier,
                                     request->images());
    if (!resolved.ok()) return resolved.status();
    ServedModel* m = resolved->model;
    const int64_t classes = m->model.vit->config().classes;
    const int64_t top_k = std::min<int64_t>(request->top_k() == 0 ? 5 : request->top_k(), classes);
    const bool full = request->return_probabilities();
    const AttentionCost cost = m->flops;
    const std::vector<std::string> labels = m->model.vit->config().labels;
    ClassifyJob job;
    job.images = resolved->images;
    job.deadline = SteadyDeadline(ctx);
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    auto reply = [this, call, response, top_k, full, cost, labels, name = m->spec.name](
                     absl::StatusOr<at::Tensor> probs, double queue_seconds) {
      if (observer_ && queue_seconds > 0) observer_->OnQueued("Classify", name, queue_seconds);
      call->NoteQueued(queue_seconds);
      call->Finish(Guarded("Classify", [&]() -> absl::Status {
        Fault("reply");
        if (!probs.ok()) return probs.status();
        const int64_t n = probs->size(0), k = probs->size(1);
        const float* p = probs->data_ptr<float>();
        response->set_model(name);
        std::vector<int64_t> order(k);
        for (int64_t i = 0; i < n; ++i) {
          const float* row = p + i * k;
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [row](int64_t a, int64_t b) { return row[a] > row[b]; });
          v1::Classification* c = response->add_results();
          for (int64_t j = 0; j < top_k; ++j) {
            v1::ClassScore* s = c->add_top();
            s->set_index(static_cast<uint32_t>(order[j]));
            if (order[j] < static_cast<int64_t>(labels.size())) s->set_label(labels[order[j]]);
            s->set_probability(row[order[j]]);
          }
          if (full) c->mutable_probabilities()->Add(row, row + k);
        }
        response->set_flops_executed(cost.executed_flops * static_cast<double>(n));
        response->set_flops_dense_equivalent(cost.dense_equivalent_flops * static_cast<double>(n));
        if (observer_) {
          observer_->OnFlops("Classify", name, response->flops_executed(),
                             response->flops_dense_equivalent());
          observer_->OnImages("Classify", name, n);
        }
        return absl::OkStatus();
      }));
    };
    // On the batcher thread. With requests queued, the reply goes to the reply pool so that the
    // next batch starts at once; with none, nothing waits for this thread, and the hop to another
    // thread would only add its wake-up to the call's latency (measured: 0.2-0.3 ms of a 2.5 ms
    // call at concurrency 1), so the batcher replies itself.
    job.done = [this, reply = std::move(reply), batcher = m->batcher.get()](
                   absl::StatusOr<at::Tensor> probs, double queue_s) {
      if (batcher->queued_images() == 0) {
        reply(probs, queue_s);
        return;
      }
      replies_.Post([reply, probs = std::move(probs), queue_s] { reply(probs, queue_s); });
    };
    return m->batcher->Enqueue(std::move(job));
  });
  if (!st.ok()) call->Finish(st);
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* KrauseService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  return new GenerateCall(this, ctx, request);
}

grpc::ServerUnaryReactor* KrauseService::Score(grpc::CallbackServerContext* ctx,
                                               const v1::ScoreRequest* request,
                                               v1::ScoreResponse* response) {
  auto call = std::make_shared<UnaryCall>(this, ctx, "Score");
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(ctx)) return reactor;
  const absl::Status st = Guarded("Score", [&]() -> absl::Status {
    auto resolved = ResolveImageCall(call.get(), *this, request->model(), ModelKind::kGenerator,
                                     request->images());
    if (!resolved.ok()) return resolved.status();
    ServedModel* m = resolved->model;
    const at::Tensor& images = resolved->images;
    const int64_t n = images.size(0);
    const PixelModelConfig& c = m->model.pixel->config();
    const AttentionCost cost = m->flops;
    ScoreJob job;
    auto labels = ScoreClasses(*request, c, m->spec.name, n);
    if (!labels.ok()) return labels.status();
    job.labels = std::move(*labels);
    job.images = images.permute({0, 2, 3, 1}).reshape({n, -1}).contiguous();
    job.deadline = SteadyDeadline(ctx);
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    auto reply = [this, call, response, n, cost, name = m->spec.name,
                  scored = c.seq_len() - (c.start_token ? 0 : 1)](
                     const absl::StatusOr<std::vector<double>>& bpd) {
      call->Finish(Guarded("Score", [&]() -> absl::Status {
        Fault("reply");
        if (!bpd.ok()) return bpd.status();
        response->set_model(name);
        double sum = 0;
        for (double b : *bpd) {
          response->add_bits_per_dim(b);
          sum += b;
        }
        response->set_mean_bits_per_dim(sum / static_cast<double>(n));
        response->set_scored_subpixels_per_image(static_cast<uint32_t>(scored));
        response->set_flops_executed(cost.executed_flops * static_cast<double>(n));
        response->set_flops_dense_equivalent(cost.dense_equivalent_flops * static_cast<double>(n));
        if (observer_) {
          observer_->OnFlops("Score", name, response->flops_executed(),
                             response->flops_dense_equivalent());
          observer_->OnImages("Score", name, n);
        }
        return absl::OkStatus();
      }));
    };
    job.done = [this, reply = std::move(reply)](absl::StatusOr<std::vector<double>> bpd) {
      replies_.Post([reply, bpd = std::move(bpd)] { reply(bpd); });
    };
    return m->generator->EnqueueScore(std::move(job));
  });
  if (!st.ok()) call->Finish(st);
  return reactor;
}

}  // namespace krause::server
