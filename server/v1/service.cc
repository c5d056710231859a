#include "server/v1/service.h"

#include <memory>

#include "server/core/errors.h"
#include "server/edge/grpc_call.h"
#include "server/edge/status.h"
#include "server/v1/generate_call.h"

namespace krause::server {
namespace {

// What the call lends to its work: its deadline, and whether the client left.
CallLimits LimitsOf(grpc::CallbackServerContext* ctx) {
  CallLimits l;
  l.deadline = SteadyDeadline(ctx);
  l.cancelled = [ctx] { return ctx->IsCancelled(); };
  return l;
}

}  // namespace

grpc::ServerUnaryReactor* KrauseService::ListModels(grpc::CallbackServerContext* ctx,
                                                    const v1::ListModelsRequest* request,
                                                    v1::ListModelsResponse* response) {
  return Unary(ctx, "ListModels", *request, response, StartListModels);
}

grpc::ServerUnaryReactor* KrauseService::GetModel(grpc::CallbackServerContext* ctx,
                                                  const v1::GetModelRequest* request,
                                                  v1::ModelInfo* response) {
  return Unary(ctx, "GetModel", *request, response, StartGetModel);
}

grpc::ServerUnaryReactor* KrauseService::Classify(grpc::CallbackServerContext* ctx,
                                                  const v1::ClassifyRequest* request,
                                                  v1::ClassifyResponse* response) {
  return Unary(ctx, "Classify", *request, response, StartClassify);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* KrauseService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  return GenerateCall::Start(edge_, ctx, request);
}

grpc::ServerUnaryReactor* KrauseService::Score(grpc::CallbackServerContext* ctx,
                                               const v1::ScoreRequest* request,
                                               v1::ScoreResponse* response) {
  return Unary(ctx, "Score", *request, response, StartScore);
}

grpc::ServerUnaryReactor* KrauseService::Inspect(grpc::CallbackServerContext* ctx,
                                                 const v1::InspectRequest* request,
                                                 v1::InspectResponse* response) {
  return Unary(ctx, "Inspect", *request, response, StartInspect);
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* KrauseService::Unary(
    grpc::CallbackServerContext* ctx, const char* rpc, const Request& request, Response* response,
    absl::Status (*start)(const UnaryCallContext&, const Request&, Response*, UnaryDone)) {
  auto call =
      std::make_shared<UnaryCall>(edge_->gate, edge_->observer, edge_->request_log, ctx, rpc);
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter()) return reactor;
  UnaryCallContext c{edge_, call->book(), LimitsOf(ctx)};
  c.limits.share = call->book()->share();
  const absl::Status st = Guarded(rpc, [&] {
    return start(c, request, response, [call](absl::Status s) { call->Finish(s); });
  });
  if (!st.ok()) call->Finish(st);
  return reactor;
}

}  // namespace krause::server
