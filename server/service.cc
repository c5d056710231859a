#include "server/service.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/generate_call.h"
#include "server/images.h"
#include "server/model_info_proto.h"
#include "server/served_classifier.h"
#include "server/served_generator.h"
#include "server/status.h"

namespace krause::server {
namespace {

// A krause.v1 unary call.
class NativeCall : public UnaryCall {
 public:
  NativeCall(KrauseService* svc, grpc::CallbackServerContext* ctx, const char* rpc)
      : UnaryCall(svc->gate(), svc->observer(), svc->request_log(), ctx, rpc) {}
  void set_model(std::shared_ptr<const ServedModel> m) { book()->set_model(std::move(m)); }
  void set_images(int64_t n) { book()->set_images(n); }
  void NoteQueued(double seconds) { book()->NoteQueued(seconds); }
};

template <typename Kind>
struct ResolvedCall {
  std::shared_ptr<Kind> model;  // the call's book holds it too
  at::Tensor images;            // [n, C, H, W] uint8
};

// The common start of Classify and Score (after the gate): find the model of the kind, decode
// the images.
template <typename Kind>
absl::StatusOr<ResolvedCall<Kind>> ResolveImageCall(
    NativeCall* call, const KrauseService& svc, const std::string& model,
    const std::string& version, const google::protobuf::RepeatedPtrField<v1::Image>& images) {
  auto found = svc.gate()->registry()->Find<Kind>(model, version);
  if (!found.ok()) return found.status();
  call->set_model(*found);
  call->set_images(images.size());
  auto decoded = DecodeImages(images, **found, svc.fault_hook());
  if (!decoded.ok()) return decoded.status();
  return ResolvedCall<Kind>{*found, *decoded};
}

// A successful Classify or Score of n images: its FLOPs (executed, dense-equivalent), reported
// to the observer with the images, for the reply.
std::pair<double, double> ReportImages(const KrauseService& svc, const char* rpc,
                                       const ServedModel& m, int64_t n) {
  const double executed = m.flops().executed_flops * static_cast<double>(n);
  const double dense = m.flops().dense_equivalent_flops * static_cast<double>(n);
  if (CallObserver* obs = svc.observer()) {
    obs->OnFlops(rpc, m.name(), executed, dense);
    obs->OnImages(rpc, m.name(), n);
  }
  return {executed, dense};
}

// The Classify reply from its rows of the batch's probabilities [n, classes]: per image the
// top_k classes (ties: the lower index first) and, with `full`, every probability.
void FillClassifyResponse(const at::Tensor& probs, int64_t top_k, bool full,
                          const std::vector<std::string>& labels, v1::ClassifyResponse* response) {
  const int64_t n = probs.size(0), k = probs.size(1);
  const float* p = probs.data_ptr<float>();
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
}

// The Score reply: bits/dim per image and their mean.
void FillScoreResponse(const std::vector<double>& bits_per_dim, int64_t scored_per_image,
                       v1::ScoreResponse* response) {
  double sum = 0;
  for (double b : bits_per_dim) {
    response->add_bits_per_dim(b);
    sum += b;
  }
  response->set_mean_bits_per_dim(sum / static_cast<double>(bits_per_dim.size()));
  response->set_scored_subpixels_per_image(static_cast<uint32_t>(scored_per_image));
}

// The Inspect reply from an inspection.
void FillInspectResponse(const Inspection& in, const ServedModel& m, v1::InspectResponse* r) {
  r->set_model(m.name());
  r->set_model_version(std::to_string(m.info().version));
  r->set_attention(in.krause ? v1::ModelInfo::KRAUSE : v1::ModelInfo::SOFTMAX);
  r->set_kind(m.kind() == ModelKind::kClassifier ? v1::ModelInfo::CLASSIFIER
                                                 : v1::ModelInfo::GENERATOR);
  r->set_implementation(m.info().implementation);
  r->set_tokens(static_cast<uint32_t>(in.tokens));
  for (int64_t q : in.queries) r->add_queries(static_cast<uint32_t>(q));
  int64_t rows = 0, columns = 0;
  for (const auto& [row, column] : in.positions) {
    r->add_token_rows(static_cast<int32_t>(row));
    r->add_token_columns(static_cast<int32_t>(column));
    rows = std::max(rows, row + 1);
    columns = std::max(columns, column + 1);
  }
  r->set_grid_height(static_cast<uint32_t>(rows));
  r->set_grid_width(static_cast<uint32_t>(columns));
  for (const LayerAttention& layer : in.layers) {
    v1::LayerAttention* l = r->add_layers();
    l->set_layer(static_cast<uint32_t>(layer.layer));
    l->set_keys_per_query(static_cast<uint32_t>(layer.k));
    for (const HeadAttention& head : layer.heads) {
      v1::HeadAttention* h = l->add_heads();
      h->set_head(static_cast<uint32_t>(head.head));
      h->set_sigma(static_cast<float>(head.sigma));
      h->set_sink_share(head.sink_share);
      h->set_mean_distance(head.mean_distance);
      h->set_effective_neighbours(head.effective_neighbours);
      h->set_busiest_key(static_cast<uint32_t>(head.busiest_key));
      h->set_busiest_key_share(head.busiest_key_share);
      for (const QueryAttention& qa : head.queries) {
        v1::QueryAttention* q = h->add_queries();
        q->set_query(static_cast<uint32_t>(qa.query));
        for (int64_t key : qa.keys) q->add_keys(static_cast<uint32_t>(key));
        q->mutable_weights()->Add(qa.weights.begin(), qa.weights.end());
        q->set_outside(qa.outside);
      }
    }
  }
}

}  // namespace

grpc::ServerUnaryReactor* KrauseService::ListModels(grpc::CallbackServerContext* ctx,
                                                    const v1::ListModelsRequest*,
                                                    v1::ListModelsResponse* response) {
  NativeCall call(this, ctx, "ListModels");
  if (!call.Enter(ctx)) return call.reactor();
  call.Finish(Guarded("ListModels", [&] {
    for (const auto& m : gate_->registry()->models()) *response->add_models() = ToProto(m->info());
    return absl::OkStatus();
  }));
  return call.reactor();
}

grpc::ServerUnaryReactor* KrauseService::GetModel(grpc::CallbackServerContext* ctx,
                                                  const v1::GetModelRequest* request,
                                                  v1::ModelInfo* response) {
  NativeCall call(this, ctx, "GetModel");
  if (!call.Enter(ctx)) return call.reactor();
  call.Finish(Guarded("GetModel", [&]() -> absl::Status {
    if (request->name().empty()) return InvalidField("name", "name is required");
    auto m = gate_->registry()->FindAny(request->name(), request->version());
    if (!m.ok()) return m.status();
    call.set_model(*m);
    *response = ToProto((*m)->info());
    return absl::OkStatus();
  }));
  return call.reactor();
}

grpc::ServerUnaryReactor* KrauseService::Classify(grpc::CallbackServerContext* ctx,
                                                  const v1::ClassifyRequest* request,
                                                  v1::ClassifyResponse* response) {
  auto call = std::make_shared<NativeCall>(this, ctx, "Classify");
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(ctx)) return reactor;
  const absl::Status st = Guarded("Classify", [&]() -> absl::Status {
    auto resolved = ResolveImageCall<ServedClassifier>(call.get(), *this, request->model(),
                                                       request->version(), request->images());
    if (!resolved.ok()) return resolved.status();
    ServedClassifier* m = resolved->model.get();
    const int64_t classes = m->config().classes;
    const int64_t top_k = std::min<int64_t>(request->top_k() == 0 ? 5 : request->top_k(), classes);
    const bool full = request->return_probabilities();
    ClassifyJob job;
    job.images = resolved->images;
    job.deadline = SteadyDeadline(ctx);
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    auto reply = [this, call, response, top_k, full, m](absl::StatusOr<at::Tensor> probs,
                                                        double queue_seconds) {
      if (observer_ && queue_seconds > 0) observer_->OnQueued("Classify", m->name(), queue_seconds);
      call->NoteQueued(queue_seconds);
      call->Finish(Guarded("Classify", [&]() -> absl::Status {
        Fault("reply");
        if (!probs.ok()) return probs.status();
        response->set_model(m->name());
        response->set_model_version(std::to_string(m->info().version));
        FillClassifyResponse(*probs, top_k, full, m->config().labels, response);
        const auto [executed, dense] = ReportImages(*this, "Classify", *m, probs->size(0));
        response->set_flops_executed(executed);
        response->set_flops_dense_equivalent(dense);
        return absl::OkStatus();
      }));
    };
    // On the batcher thread. With requests queued, the reply goes to the reply pool so that the
    // next batch starts at once; with none, nothing waits for this thread, and the hop to another
    // thread would only add its wake-up to the call's latency (measured: 0.2-0.3 ms of a 2.5 ms
    // call at concurrency 1), so the batcher replies itself.
    job.done = [this, reply = std::move(reply), batcher = &m->batcher()](
                   absl::StatusOr<at::Tensor> probs, double queue_s) {
      if (batcher->queued_images() == 0) {
        reply(probs, queue_s);
        return;
      }
      replies_.Post([reply, probs = std::move(probs), queue_s] { reply(probs, queue_s); });
    };
    return m->batcher().Enqueue(std::move(job));
  });
  if (!st.ok()) call->Finish(st);
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* KrauseService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  return GenerateCall::Start(this, ctx, request);
}

grpc::ServerUnaryReactor* KrauseService::Score(grpc::CallbackServerContext* ctx,
                                               const v1::ScoreRequest* request,
                                               v1::ScoreResponse* response) {
  auto call = std::make_shared<NativeCall>(this, ctx, "Score");
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(ctx)) return reactor;
  const absl::Status st = Guarded("Score", [&]() -> absl::Status {
    auto resolved = ResolveImageCall<ServedGenerator>(call.get(), *this, request->model(),
                                                      request->version(), request->images());
    if (!resolved.ok()) return resolved.status();
    ServedGenerator* m = resolved->model.get();
    const at::Tensor& images = resolved->images;
    const int64_t n = images.size(0);
    const PixelModelConfig& c = m->config();
    ScoreJob job;
    auto labels = ScoreClasses(*request, *m, n);
    if (!labels.ok()) return labels.status();
    job.labels = std::move(*labels);
    job.images = images.permute({0, 2, 3, 1}).reshape({n, -1}).contiguous();
    job.deadline = SteadyDeadline(ctx);
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    auto reply = [this, call, response, m, scored = c.seq_len() - (c.start_token ? 0 : 1)](
                     const absl::StatusOr<std::vector<double>>& bpd) {
      call->Finish(Guarded("Score", [&]() -> absl::Status {
        Fault("reply");
        if (!bpd.ok()) return bpd.status();
        response->set_model(m->name());
        response->set_model_version(std::to_string(m->info().version));
        FillScoreResponse(*bpd, scored, response);
        const auto [executed, dense] =
            ReportImages(*this, "Score", *m, static_cast<int64_t>(bpd->size()));
        response->set_flops_executed(executed);
        response->set_flops_dense_equivalent(dense);
        return absl::OkStatus();
      }));
    };
    job.done = [this, reply = std::move(reply)](absl::StatusOr<std::vector<double>> bpd) {
      replies_.Post([reply, bpd = std::move(bpd)] { reply(bpd); });
    };
    return m->worker().EnqueueScore(std::move(job));
  });
  if (!st.ok()) call->Finish(st);
  return reactor;
}

grpc::ServerUnaryReactor* KrauseService::Inspect(grpc::CallbackServerContext* ctx,
                                                 const v1::InspectRequest* request,
                                                 v1::InspectResponse* response) {
  auto call = std::make_shared<NativeCall>(this, ctx, "Inspect");
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(ctx)) return reactor;
  const absl::Status st = Guarded("Inspect", [&]() -> absl::Status {
    // Any classifier or generator; the default classifier when the name is empty.
    auto found = request->model().empty()
                     ? gate()->registry()->Find("", ModelKind::kClassifier, request->version())
                     : gate()->registry()->FindAny(request->model(), request->version());
    if (!found.ok()) return found.status();
    const std::shared_ptr<const ServedModel> m = *found;
    call->set_model(m);
    call->set_images(1);
    Fault("decode");
    auto image = DecodeImage(request->image(), "image", ImageBounds{m->info().shape, m->name()});
    if (!image.ok()) return image.status();
    InspectOptions o;
    o.layers.assign(request->layers().begin(), request->layers().end());
    o.queries.assign(request->queries().begin(), request->queries().end());
    o.top_k = request->top_k();
    o.max_entries = inspect_max_entries_;
    const bool by_name = request->condition_case() == v1::InspectRequest::kLabel;
    const bool has_class = request->condition_case() != v1::InspectRequest::CONDITION_NOT_SET;
    const char* class_field = by_name ? "label" : "class_index";
    // The work and its result: computed on the model's thread, replied from the reply pool.
    auto result = std::make_shared<absl::StatusOr<Inspection>>(absl::UnknownError("not run"));
    auto reply = [this, call, response, m, result](const absl::Status& st) {
      call->Finish(Guarded("Inspect", [&]() -> absl::Status {
        Fault("reply");
        if (!st.ok()) return st;
        FillInspectResponse(**result, *m, response);
        return absl::OkStatus();
      }));
    };
    auto done = [this, reply = std::move(reply)](absl::Status st) {
      replies_.Post([reply, st = std::move(st)] { reply(st); });
    };
    std::string field;
    if (m->kind() == ModelKind::kClassifier) {
      auto* c = static_cast<const ServedClassifier*>(m.get());
      if (has_class) {
        return InvalidField(class_field, absl::StrCat(class_field, ": model ", m->name(),
                                                      " is a classifier; a class is for "
                                                      "conditional generators"));
      }
      o.impl = c->batcher().options().attention_impl;
      if (absl::Status bad = CheckInspectOptions(InspectShapeOf(c->vit()), o, &field); !bad.ok())
        return InvalidField(field, bad.message());
      SideJob job;
      job.deadline = SteadyDeadline(ctx);
      job.cancelled = [ctx] { return ctx->IsCancelled(); };
      job.work = [o, result, pixels = image->permute({2, 0, 1}).contiguous()](const ViT& vit) {
        *result = InspectClassifier(vit, pixels, o);
        return result->status();
      };
      job.done = std::move(done);  // the work's status, or why it did not run
      return c->batcher().EnqueueSide(std::move(job));
    }
    auto* g = static_cast<const ServedGenerator*>(m.get());
    int64_t class_row = -1;
    if (has_class) {
      auto cls = RequestedClass(*g, by_name, request->label(), request->class_index());
      if (!cls.ok()) return cls.status();
      class_row = *cls;
    }
    if (absl::Status bad = CheckInspectOptions(InspectShapeOf(g->pixel()), o, &field); !bad.ok())
      return InvalidField(field, bad.message());
    ScoreJob job;
    job.images = image->reshape({1, -1}).contiguous();  // the raster order, as Score
    job.deadline = SteadyDeadline(ctx);
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    job.work = [o, result, class_row, raster = job.images[0]](const PixelModel& model,
                                                              KrauseImpl impl) mutable {
      o.impl = impl;
      *result = InspectGenerator(model, raster, class_row, o);
      return result->status();
    };
    job.done = [done = std::move(done)](absl::StatusOr<std::vector<double>> r) {
      done(r.status());  // the work's status, or why it did not run
    };
    return g->worker().EnqueueScore(std::move(job));
  });
  if (!st.ok()) call->Finish(st);
  return reactor;
}

}  // namespace krause::server
