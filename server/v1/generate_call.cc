#include "server/v1/generate_call.h"

#include <ATen/ATen.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/data/png.h"
#include "server/core/registry.h"
#include "server/edge/status.h"
#include "server/v1/requests.h"

namespace krause::server {

GenerateCall::GenerateCall(const FrontEndContext* edge)
    : edge_(edge), book_(edge->gate, edge->observer, edge->request_log, "Generate") {}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerateCall::Start(
    const FrontEndContext* edge, grpc::CallbackServerContext* ctx,
    const v1::GenerateRequest* request) {
  std::shared_ptr<GenerateCall> call(new GenerateCall(edge));
  call->self_ = call;
  absl::Status st = call->book_.Enter(ctx);
  if (st.ok()) st = Guarded("Generate", [&] { return call->Begin(ctx, *request); });
  if (!st.ok()) call->FinishCall(st);
  return call.get();
}

absl::Status GenerateCall::Begin(grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req) {
  auto found = edge_->gate->registry()->Find(req.model(), ModelKind::kGenerator, req.version());
  if (!found.ok()) return found.status();
  model_ = found->get();  // the book holds the reference
  book_.set_model(*found);
  auto parsed = ParseGenerate(req, *model_, edge_->fault);
  if (!parsed.ok()) return parsed.status();
  GeneratePlan& plan = parsed->plan;
  const int64_t images = static_cast<int64_t>(plan.images.size());
  GenerateStream::Options so;
  so.shape = model_->info().shape;
  so.images = images;
  so.prompt = plan.images.front().prompt;
  so.seed = plan.seed;
  so.first_image = plan.first_image;
  so.passes = plan.passes;
  so.cost = model_->flops();
  so.start = book_.start();
  so.deadline = SteadyDeadline(ctx);
  so.interval = parsed->stream.interval;
  so.stream_rows = parsed->stream.rows;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_.emplace(std::move(so));
  }
  book_.set_images(images);
  // The engine's own checks (a prompt too long for the model, guidance on an engine with one
  // cache slot) name the request field they are about.
  const absl::Status st = model_->Generate(std::move(plan.images), shared_from_this());
  if (!absl::IsInvalidArgument(st)) return st;
  return WithField(st, absl::StartsWith(st.message(), "guidance") ? "guidance" : "prompt_rows");
}

void GenerateCall::OnUpdate(const CallUpdate& u) {
  std::vector<double> waits;  // each newly admitted image's wait for its slot
  bool stop, post;
  {
    std::lock_guard<std::mutex> lock(mu_);
    GenerateStream& s = *stream_;
    for (int64_t image : u.admitted) waits.push_back(s.Admitted(image, u.admitted_at));
    for (const CallUpdate::Pixel& p : u.pixels) s.Pixel(p.image, p.index, p.value, u.now);
    for (const CallUpdate::Done& d : u.done) s.Done(d.image, d.status);
    worker_stopping_ = worker_stopping_ || u.stopping;
    stop = s.DeadlinePassed(u.now);
    // Building and sending happen on the reply pool: here only whether a flush is worth posting
    // (one at a time; a write in flight flushes again when done).
    post = s.ShouldPostFlush(u.now);
  }
  if (CallObserver* obs = edge_->observer)
    for (double w : waits) obs->OnQueued("Generate", model_->name(), w);
  if (stop) StopImages();
  if (post) edge_->replies->Post([self = shared_from_this()] { self->Flush(); });
}

void GenerateCall::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_->WriteDone(ok);
  }
  Flush();
}

void GenerateCall::OnCancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stream_) return;  // finished before anything was submitted
    stream_->ClientCancelled();
  }
  StopImages();
}

void GenerateCall::StopImages() { model_->CancelGeneration(this); }

void GenerateCall::FinishCall(const absl::Status& st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_) book_.NoteQueued(stream_->max_queued_seconds());
  }
  book_.Finish(this, st);
}

void GenerateCall::Flush() {
  const absl::Status st = Guarded("Generate", [&] {
    FlushOnce();
    return absl::OkStatus();
  });
  if (st.ok()) return;
  // The flush threw before its write started (StartWrite is its last step): the images still
  // running stop, and the call ends with the error.
  bool finish;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finish = stream_->Fail(st);
  }
  if (!finish) return;
  StopImages();
  FinishCall(st);
}

void GenerateCall::FlushOnce() {
  edge_->Fault("flush");
  GenerateStream::Action a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    a = stream_->Flush(Clock::now(), worker_stopping_);
  }
  if (a.kind == GenerateStream::Action::kFinish) {
    FinishCall(a.status);
    return;
  }
  if (a.kind != GenerateStream::Action::kWrite) return;
  GenerateStream::Chunk& c = a.chunk;
  if (CallObserver* obs = edge_->observer) {
    obs->OnStreamChunk(model_->name(), c.first, c.seconds_since_previous);
    if (c.has_summary) {
      obs->OnFlops("Generate", model_->name(), c.summary.flops_executed,
                   c.summary.flops_dense_equivalent);
      obs->OnImages("Generate", model_->name(), c.summary.images);
    }
  }
  // message_ is this flush's alone until StartWrite: the stream writes one chunk at a time.
  BuildMessage(c);
  StartWrite(&message_);
}

void GenerateCall::BuildMessage(GenerateStream::Chunk& c) {
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
  const ImageShape& shape = model_->info().shape;
  if (c.first) {
    v1::GenerateStart* s = message_.mutable_start();
    s->set_model(model_->name());
    s->set_model_version(std::to_string(model_->info().version));
    s->set_seed(c.seed);
    s->set_first_image(static_cast<uint32_t>(c.first_image));
    s->set_height(static_cast<uint32_t>(shape.height));
    s->set_width(static_cast<uint32_t>(shape.width));
    s->set_channels(static_cast<uint32_t>(shape.channels));
  }
  for (GenerateStream::FinishedImage& im : c.images) {
    const at::Tensor hwc =
        at::from_blob(im.pixels.data(), {shape.height, shape.width, shape.channels}, at::kByte);
    auto png = EncodePng(hwc);
    if (!png.ok()) {  // the call ends with this error after the message
      std::lock_guard<std::mutex> lock(mu_);
      stream_->EncodeFailed(im.image, absl::InternalError(absl::StrCat("PNG encoding failed: ",
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
    s->set_model(model_->name());
    s->set_model_version(std::to_string(model_->info().version));
    s->set_images(static_cast<uint32_t>(c.summary.images));
    s->set_pixels_generated(static_cast<uint64_t>(c.summary.pixels_generated));
    s->set_seconds(c.summary.seconds);
    s->set_seconds_to_first_pixel(c.summary.seconds_to_first_pixel);
    s->set_seed(c.summary.seed);
    s->set_flops_executed(c.summary.flops_executed);
    s->set_flops_dense_equivalent(c.summary.flops_dense_equivalent);
  }
}

}  // namespace krause::server
