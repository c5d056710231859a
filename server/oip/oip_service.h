// inference.GRPCInferenceService (the Open Inference Protocol over gRPC) beside krause.v1 on the
// same server: the same models, batches, gate (tokens, loading, draining), deadlines, reply pool,
// request log and metrics (rpc ModelInfer etc., protocol oip-grpc). The handlers convert the
// messages (oip_proto.h) and hand the request to StartInfer (oip_infer.h).
// ServerLive, ServerReady and ModelReady are probes: like gRPC's health service they need no
// token and are not counted; the other RPCs pass the gate like any krause.v1 call.
// Thread-safety: all handlers may run concurrently.
#pragma once

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/edge/front_end.h"

namespace krause::server {

class OipService final : public inference::GRPCInferenceService::CallbackService {
 public:
  // `edge` (the gate, observer, request log, reply pool, fault hook) must outlive the service.
  explicit OipService(const FrontEndContext* edge) : edge_(edge) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  // The model repository extension (oip_repository.h): admin calls, carried out by the model
  // control thread.
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* ctx, const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* ctx, const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;

 private:
  const FrontEndContext* const edge_;
};

}  // namespace krause::server
