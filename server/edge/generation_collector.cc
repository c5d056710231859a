#include "server/edge/generation_collector.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/data/png.h"
#include "server/core/registry.h"

namespace krause::server {

absl::Status GenerationCollector::Submit(const std::string& name, const std::string& version,
                                         const GenerateSettings& settings,
                                         Clock::time_point deadline) {
  const Registry* registry = edge_->registry.load();
  auto found = registry->Find(name, ModelKind::kGenerator, version);
  if (!found.ok()) return found.status();
  return Submit(*std::move(found), settings, deadline);
}

absl::Status GenerationCollector::Submit(ModelRef model, const GenerateSettings& settings,
                                         Clock::time_point deadline,
                                         std::function<bool()> cancelled) {
  model_ = model.get();  // the book holds the reference
  book_->set_model(std::move(model));
  if (absl::Status st = book_->SetPriority(settings.priority, settings.priority_field); !st.ok())
    return st;
  auto plan = ResolveGenerate(settings, *model_, edge_->fault);
  if (!plan.ok()) return plan.status();
  plan_ = *std::move(plan);
  cancelled_ = std::move(cancelled);
  const int64_t images = static_cast<int64_t>(plan_.images.size());
  GenerateStream::Options so;
  so.shape = model_->info().shape;
  so.images = images;
  so.prompt = plan_.images.front().prompt;
  so.seed = plan_.seed;
  so.first_image = plan_.first_image;
  so.passes = plan_.passes;
  so.cost = model_->flops();
  so.start = book_->start();
  so.deadline = deadline;
  if (plan_.timeout.count() > 0) so.deadline = std::min(deadline, so.start + plan_.timeout);
  so.interval = plan_.interval;
  so.output = plan_.output;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_.emplace(std::move(so));
  }
  book_->set_images(images);
  // The engine's own checks (a prompt too long for the model, guidance on an engine with one
  // cache slot) name the request field they are about.
  const absl::Status st =
      model_->Generate(std::move(plan_.images), shared_from_this(), book_->share());
  if (!absl::IsInvalidArgument(st)) return st;
  return WithField(st, absl::StartsWith(st.message(), "guidance") ? "guidance" : "prompt_rows");
}

void GenerationCollector::OnUpdate(const CallUpdate& u) {
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
  for (double w : waits) book_->Queued(w);
  // A caller that cannot say it left is asked (once it said so, the images are stopping).
  if (cancelled_ && !gone_polled_ && cancelled_()) {
    gone_polled_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    stream_->ClientCancelled();
    stop = true;
  }
  if (stop) StopImages();
  if (post) edge_->replies->Post([self = shared_from_this()] { self->Flush(); });
}

void GenerationCollector::WriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_->WriteDone(ok);
  }
  Flush();
}

void GenerationCollector::ClientGone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stream_) return;  // finished before anything was submitted
    stream_->ClientCancelled();
  }
  StopImages();
}

void GenerationCollector::StopImages() { model_->CancelGeneration(this); }

void GenerationCollector::FinishCall(const absl::Status& st) { EndCall(st); }

void GenerationCollector::Flush() {
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

void GenerationCollector::FlushOnce() {
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
  CallObserver* obs = edge_->observer;
  if (obs != nullptr && plan_.output != GenerateOutput::kFinal)
    obs->OnStreamChunk(model_->name(), c.first, c.seconds_since_previous);
  if (c.has_summary)
    book_->Served(c.summary.images, {c.summary.flops_executed, c.summary.flops_dense_equivalent});
  std::vector<EncodedImage> images = Encode(c);
  WriteChunk(c, std::move(images));
}

std::vector<GenerationCollector::EncodedImage> GenerationCollector::Encode(
    GenerateStream::Chunk& c) {
  std::vector<EncodedImage> out;
  const ImageShape& shape = model_->info().shape;
  for (GenerateStream::FinishedImage& im : c.images) {
    if (!png_) {
      out.push_back({im.image, im.seed, "", std::move(im.pixels)});
      continue;
    }
    const at::Tensor hwc =
        at::from_blob(im.pixels.data(), {shape.height, shape.width, shape.channels}, at::kByte);
    auto png = EncodePng(hwc);
    if (!png.ok()) {  // the call ends with this error after the chunk
      std::lock_guard<std::mutex> lock(mu_);
      stream_->EncodeFailed(im.image, absl::InternalError(absl::StrCat("PNG encoding failed: ",
                                                                       png.status().message())));
      continue;
    }
    out.push_back({im.image, im.seed, std::move(*png), {}});
  }
  return out;
}

}  // namespace krause::server
