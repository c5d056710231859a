#include "server/service.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/generate_call.h"
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

}  // namespace krause::server
