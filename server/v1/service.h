// krause.v1.KrauseService on gRPC's callback API: the krause.v1 front end. The unary handlers run
// unary.h's functions (shared with the Connect protocol over HTTP, connect_http.h): they check
// the request (requests.h turns it into the core's types) and start an operation of the served
// model (core/operations.h: Classify, Score, Inspect); the reply is built in the operation's
// `done`, on the reply pool or (an idle classifier) on the model's thread: the rule
// is the core's. They run no model, except that a Classify may run its forward on the RPC thread
// when it arrives at an idle batcher (RunOnArrival, classify_batcher.h). A Generate call is its
// own object (generate_call.h). Every call passes the Gate first: authentication, and refusal
// while loading or draining. Thread-safety: all handlers may run concurrently.
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "krause/v1/krause.grpc.pb.h"
#include "model/engine/inspect.h"
#include "server/core/model_control.h"
#include "server/core/registry.h"
#include "server/edge/front_end.h"
#include "server/v1/requests.h"
#include "server/v1/unary.h"

namespace krause::server {

class KrauseService final : public v1::KrauseService::CallbackService {
 public:
  // `edge` (the gate, observer, request log, reply pool, fault hook) must outlive the service.
  explicit KrauseService(const FrontEndContext* edge) : edge_(edge) {}

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* ctx,
                                     const v1::GetModelRequest* request,
                                     v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* Classify(grpc::CallbackServerContext* ctx,
                                     const v1::ClassifyRequest* request,
                                     v1::ClassifyResponse* response) override;
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx, const v1::ScoreRequest* request,
                                  v1::ScoreResponse* response) override;
  // Inspect: the model's attention on one image (model/engine/inspect.h), run by the model's
  // batcher or worker beside its other work.
  grpc::ServerUnaryReactor* Inspect(grpc::CallbackServerContext* ctx,
                                    const v1::InspectRequest* request,
                                    v1::InspectResponse* response) override;
  // Model control (service_control.cc): admin calls.
  grpc::ServerUnaryReactor* LoadModel(grpc::CallbackServerContext* ctx,
                                      const v1::LoadModelRequest* request,
                                      v1::LoadModelResponse* response) override;
  grpc::ServerUnaryReactor* UnloadModel(grpc::CallbackServerContext* ctx,
                                        const v1::UnloadModelRequest* request,
                                        v1::UnloadModelResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const v1::RepositoryIndexRequest* request,
                                            v1::RepositoryIndexResponse* response) override;
  const FrontEndContext& edge() const { return *edge_; }
  Gate* gate() const { return edge_->gate; }

 private:
  // A unary method: the gate, then `start` (unary.h), its answer finishing the call.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const char* rpc,
                                  const Request& request, Response* response,
                                  absl::Status (*start)(const UnaryCallContext&, const Request&,
                                                        Response*, UnaryDone));

  const FrontEndContext* const edge_;
};

}  // namespace krause::server
