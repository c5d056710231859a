#include "server/oip/oip_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "server/edge/grpc_call.h"
#include "server/edge/status.h"
#include "server/oip/oip_infer.h"
#include "server/oip/oip_proto.h"
#include "server/oip/oip_repository.h"
#include "server/oip/oip_statistics.h"

namespace krause::server {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& st) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(st));
  return r;
}

// A model-control request's parameters in the protocol's native form (bytes as a string).
absl::StatusOr<oip::Parameters> ParametersOf(
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>& in) {
  oip::Parameters out;
  for (const auto& [name, p] : in) {
    switch (p.parameter_choice_case()) {
      case inference::ModelRepositoryParameter::kBoolParam:
        out[name] = p.bool_param();
        break;
      case inference::ModelRepositoryParameter::kInt64Param:
        out[name] = p.int64_param();
        break;
      case inference::ModelRepositoryParameter::kStringParam:
        out[name] = p.string_param();
        break;
      case inference::ModelRepositoryParameter::kBytesParam:
        out[name] = p.bytes_param();
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", name.substr(0, 64), " has no value"));
    }
  }
  return out;
}

// A load or unload: an admin call whose answer comes from the model control thread.
template <typename Request>
grpc::ServerUnaryReactor* RepositoryChange(const FrontEndContext* edge,
                                           grpc::CallbackServerContext* ctx, const Request& request,
                                           bool load) {
  auto call = std::make_shared<UnaryCall>(edge->gate, edge->observer, edge->request_log, ctx,
                                          load ? "RepositoryModelLoad" : "RepositoryModelUnload",
                                          kProtocolOipGrpc);
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(/*admin=*/true)) return reactor;
  auto params = ParametersOf(request.parameters());
  if (!params.ok()) {
    call->Finish(params.status());
    return reactor;
  }
  oip::StartRepositoryChange(edge->control.load(), load, request.model_name(), *params,
                             [call](absl::Status st) { call->Finish(st); });
  return reactor;
}

// The readiness probes' view: models loaded and not draining.
bool Ready(const FrontEndContext& edge) {
  return edge.registry.load() != nullptr && !edge.gate->draining();
}

}  // namespace

grpc::ServerUnaryReactor* OipService::ServerLive(grpc::CallbackServerContext* ctx,
                                                 const inference::ServerLiveRequest*,
                                                 inference::ServerLiveResponse* response) {
  response->set_live(true);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ServerReady(grpc::CallbackServerContext* ctx,
                                                  const inference::ServerReadyRequest*,
                                                  inference::ServerReadyResponse* response) {
  response->set_ready(Ready(*edge_));
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ModelReady(grpc::CallbackServerContext* ctx,
                                                 const inference::ModelReadyRequest* request,
                                                 inference::ModelReadyResponse* response) {
  const Registry* registry = edge_->registry.load();
  if (registry == nullptr) {  // still loading: no model is ready yet
    response->set_ready(false);
    return Done(ctx, absl::OkStatus());
  }
  auto m = oip::FindModel(*registry, request->name(), request->version());
  if (m.status().code() == absl::StatusCode::kUnavailable) {  // unloaded by model control
    response->set_ready(false);
    return Done(ctx, absl::OkStatus());
  }
  if (!m.ok()) return Done(ctx, m.status());
  response->set_ready(!edge_->gate->draining());
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ServerMetadata(grpc::CallbackServerContext* ctx,
                                                     const inference::ServerMetadataRequest*,
                                                     inference::ServerMetadataResponse* response) {
  UnaryCall call(edge_->gate, edge_->observer, edge_->request_log, ctx, "ServerMetadata",
                 kProtocolOipGrpc);
  if (!call.Enter()) return call.reactor();
  response->set_name(oip::kServerName);
  response->set_version(oip::ServerVersion());
  for (const std::string& e : oip::Extensions()) response->add_extensions(e);
  call.Finish(absl::OkStatus());
  return call.reactor();
}

grpc::ServerUnaryReactor* OipService::ModelMetadata(grpc::CallbackServerContext* ctx,
                                                    const inference::ModelMetadataRequest* request,
                                                    inference::ModelMetadataResponse* response) {
  UnaryCall call(edge_->gate, edge_->observer, edge_->request_log, ctx, "ModelMetadata",
                 kProtocolOipGrpc);
  if (!call.Enter()) return call.reactor();
  call.Finish(Guarded("ModelMetadata", [&]() -> absl::Status {
    auto m = oip::FindModel(*edge_->registry.load(), request->name(), request->version());
    if (!m.ok()) return m.status();
    call.book()->set_model(*m);
    oip::ToProto(oip::MetadataOf(**m, edge_->registry.load()->Versions(request->name())), response);
    return absl::OkStatus();
  }));
  return call.reactor();
}

grpc::ServerUnaryReactor* OipService::ModelInfer(grpc::CallbackServerContext* ctx,
                                                 const inference::ModelInferRequest* request,
                                                 inference::ModelInferResponse* response) {
  auto call = std::make_shared<UnaryCall>(edge_->gate, edge_->observer, edge_->request_log, ctx,
                                          "ModelInfer", kProtocolOipGrpc);
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter()) return reactor;
  const absl::Status st = Guarded("ModelInfer", [&]() -> absl::Status {
    auto parsed = oip::FromProto(*request);
    if (!parsed.ok()) return parsed.status();
    oip::InferContext c;
    c.edge = edge_;
    c.book = call->book();
    c.deadline = SteadyDeadline(ctx);
    c.cancelled = [ctx] { return ctx->IsCancelled(); };
    return oip::StartInfer(*edge_->registry.load(), std::move(*parsed), c,
                           [call, response](absl::StatusOr<oip::InferResponse> r) {
                             call->Finish(Guarded("ModelInfer", [&]() -> absl::Status {
                               if (!r.ok()) return r.status();
                               oip::ToProto(*r, response);
                               return absl::OkStatus();
                             }));
                           });
  });
  if (!st.ok()) call->Finish(st);
  return reactor;
}

grpc::ServerUnaryReactor* OipService::RepositoryIndex(
    grpc::CallbackServerContext* ctx, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  UnaryCall call(edge_->gate, edge_->observer, edge_->request_log, ctx, "RepositoryIndex",
                 kProtocolOipGrpc);
  if (!call.Enter(/*admin=*/true)) return call.reactor();
  call.Finish(Guarded("RepositoryIndex", [&] {
    for (const IndexEntry& e :
         IndexOf(edge_->control.load(), *edge_->registry.load(), request->ready())) {
      auto* m = response->add_models();
      m->set_name(e.name);
      if (e.version != 0) m->set_version(std::to_string(e.version));
      m->set_state(VersionStateName(e.state));
      m->set_reason(e.reason);
    }
    return absl::OkStatus();
  }));
  return call.reactor();
}

grpc::ServerUnaryReactor* OipService::RepositoryModelLoad(
    grpc::CallbackServerContext* ctx, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  return RepositoryChange(edge_, ctx, *request, /*load=*/true);
}

grpc::ServerUnaryReactor* OipService::RepositoryModelUnload(
    grpc::CallbackServerContext* ctx, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  return RepositoryChange(edge_, ctx, *request, /*load=*/false);
}

grpc::ServerUnaryReactor* OipService::ModelStatistics(
    grpc::CallbackServerContext* ctx, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  UnaryCall call(edge_->gate, edge_->observer, edge_->request_log, ctx, "ModelStatistics",
                 kProtocolOipGrpc);
  if (!call.Enter()) return call.reactor();
  call.Finish(Guarded("ModelStatistics", [&]() -> absl::Status {
    if (edge_->stats == nullptr) return absl::UnimplementedError("no statistics kept");
    auto stats = oip::StatisticsOf(*edge_->registry.load(), *edge_->stats, request->name(),
                                   request->version());
    if (!stats.ok()) return stats.status();
    auto set = [](const StatDuration& d, inference::StatisticDuration* out) {
      out->set_count(d.count);
      out->set_ns(d.ns);
    };
    for (const ModelStats& s : *stats) {
      inference::ModelStatistics* m = response->add_model_stats();
      m->set_name(s.name);
      m->set_version(s.version);
      m->set_last_inference(s.last_inference_ms);
      m->set_inference_count(s.inference_count);
      m->set_execution_count(s.execution_count);
      inference::InferStatistics* i = m->mutable_inference_stats();
      set(s.success, i->mutable_success());
      set(s.fail, i->mutable_fail());
      set(s.queue, i->mutable_queue());
      set(s.compute_infer, i->mutable_compute_infer());
      for (const auto& [size, d] : s.batches) {
        inference::InferBatchStatistics* b = m->add_batch_stats();
        b->set_batch_size(size);
        set(d, b->mutable_compute_infer());
      }
    }
    return absl::OkStatus();
  }));
  return call.reactor();
}

}  // namespace krause::server
