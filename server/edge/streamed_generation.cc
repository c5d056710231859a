#include "server/edge/streamed_generation.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/data/png.h"
#include "server/core/registry.h"

namespace krause::server {

StreamedGeneration::StreamedGeneration(const FrontEndContext* edge, const char* protocol)
    : edge_(edge), book_(edge->gate, edge->observer, edge->request_log, "Generate", protocol) {}

absl::Status StreamedGeneration::Submit(
    const std::string& name, const std::string& version,
    const std::function<absl::StatusOr<ParsedGenerate>(const ServedModel&)>& parse,
    Clock::time_point deadline) {
  auto found = edge_->gate->registry()->Find(name, ModelKind::kGenerator, version);
  if (!found.ok()) return found.status();
  model_ = found->get();  // the book holds the reference
  book_.set_model(*found);
  auto parsed = parse(*model_);
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
  so.deadline = deadline;
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

void StreamedGeneration::OnUpdate(const CallUpdate& u) {
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

void StreamedGeneration::WriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_->WriteDone(ok);
  }
  Flush();
}

void StreamedGeneration::ClientGone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stream_) return;  // finished before anything was submitted
    stream_->ClientCancelled();
  }
  StopImages();
}

void StreamedGeneration::StopImages() { model_->CancelGeneration(this); }

void StreamedGeneration::FinishCall(const absl::Status& st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_) book_.NoteQueued(stream_->max_queued_seconds());
  }
  Ender ender{this};
  book_.Finish(&ender, st);
}

void StreamedGeneration::Flush() {
  const absl::Status st = Guarded("Generate", [&] {
    FlushOnce();
    return absl::OkStatus();
  });
  if (st.ok()) return;
  // The flush threw before its write started (starting the write is its last step): the images
  // still running stop, and the call ends with the error.
  bool finish;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finish = stream_->Fail(st);
  }
  if (!finish) return;
  StopImages();
  FinishCall(st);
}

void StreamedGeneration::FlushOnce() {
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
  std::vector<EncodedImage> images = Encode(c);
  WriteChunk(c, std::move(images));
}

std::vector<StreamedGeneration::EncodedImage> StreamedGeneration::Encode(GenerateStream::Chunk& c) {
  std::vector<EncodedImage> out;
  const ImageShape& shape = model_->info().shape;
  for (GenerateStream::FinishedImage& im : c.images) {
    const at::Tensor hwc =
        at::from_blob(im.pixels.data(), {shape.height, shape.width, shape.channels}, at::kByte);
    auto png = EncodePng(hwc);
    if (!png.ok()) {  // the call ends with this error after the chunk
      std::lock_guard<std::mutex> lock(mu_);
      stream_->EncodeFailed(im.image, absl::InternalError(absl::StrCat("PNG encoding failed: ",
                                                                       png.status().message())));
      continue;
    }
    out.push_back({im.image, im.seed, std::move(*png)});
  }
  return out;
}

}  // namespace krause::server
