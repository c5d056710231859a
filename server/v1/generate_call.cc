#include "server/v1/generate_call.h"

#include <string>

#include "server/core/registry.h"
#include "server/v1/requests.h"

namespace krause::server {

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerateCall::Start(
    const FrontEndContext* edge, grpc::CallbackServerContext* ctx,
    const v1::GenerateRequest* request) {
  std::shared_ptr<GenerateCall> call(new GenerateCall(edge, ctx));
  call->self_ = call;
  absl::Status st = EnterGrpc(call->book(), ctx);
  if (st.ok()) {
    st = Guarded("Generate", [&]() -> absl::Status {
      auto settings = SettingsOf(*request);
      if (!settings.ok()) return settings.status();
      return call->Submit(request->model(), request->version(), *settings, SteadyDeadline(ctx));
    });
  }
  if (!st.ok()) call->FinishCall(st);
  return call.get();
}

void GenerateCall::WriteChunk(GenerateStream::Chunk& c, std::vector<EncodedImage> images) {
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
  const ModelInfo& info = model().info();
  if (c.first) {
    v1::GenerateStart* s = message_.mutable_start();
    s->set_model(model().name());
    s->set_model_version(std::to_string(info.version));
    s->set_seed(c.seed);
    s->set_first_image(static_cast<uint32_t>(c.first_image));
    s->set_height(static_cast<uint32_t>(info.shape.height));
    s->set_width(static_cast<uint32_t>(info.shape.width));
    s->set_channels(static_cast<uint32_t>(info.shape.channels));
    s->set_numerics(info.numerics);
  }
  for (EncodedImage& im : images) {
    v1::GeneratedImage* g = message_.add_images();
    g->set_image(static_cast<uint32_t>(im.image));
    g->set_seed(im.seed);
    g->set_png(std::move(im.png));
  }
  if (c.has_summary) {
    v1::GenerateSummary* s = message_.mutable_summary();
    s->set_model(model().name());
    s->set_model_version(std::to_string(info.version));
    s->set_images(static_cast<uint32_t>(c.summary.images));
    s->set_pixels_generated(static_cast<uint64_t>(c.summary.pixels_generated));
    s->set_seconds(c.summary.seconds);
    s->set_seconds_to_first_pixel(c.summary.seconds_to_first_pixel);
    s->set_seed(c.summary.seed);
    s->set_flops_executed(c.summary.flops_executed);
    s->set_flops_dense_equivalent(c.summary.flops_dense_equivalent);
  }
  // message_ is this flush's alone until the write is done: the stream writes one at a time.
  StartWrite(&message_);
}

}  // namespace krause::server
