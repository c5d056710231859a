// KrauseService's model-control calls (LoadModel, UnloadModel, RepositoryIndex): admin calls
// through the gate, carried out by ModelControl on its thread; the reply is finished from there.
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/edge/grpc_call.h"
#include "server/edge/status.h"
#include "server/v1/service.h"

namespace krause::server {
namespace {

v1::RepositoryEntry::State ToProto(VersionState s) {
  switch (s) {
    case VersionState::kLoading:
      return v1::RepositoryEntry::LOADING;
    case VersionState::kReady:
      return v1::RepositoryEntry::READY;
    case VersionState::kUnloading:
      return v1::RepositoryEntry::UNLOADING;
    case VersionState::kUnavailable:
      return v1::RepositoryEntry::UNAVAILABLE;
    case VersionState::kFailed:
      return v1::RepositoryEntry::FAILED;
  }
  return v1::RepositoryEntry::STATE_UNSPECIFIED;
}

template <typename Entries>
void Fill(const std::vector<IndexEntry>& entries, Entries* out) {
  for (const IndexEntry& e : entries) {
    v1::RepositoryEntry* p = out->Add();
    p->set_name(e.name);
    if (e.version != 0) p->set_version(std::to_string(e.version));
    p->set_state(ToProto(e.state));
    p->set_reason(e.reason);
  }
}

// A model-control call carried out on the control thread: the gate's admin check, then
// `start(control, done)`; `done` fills `entries` with the model's versions and finishes the call.
template <typename Entries>
grpc::ServerUnaryReactor* ControlCall(
    std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext* ctx, ModelControl* control,
    const char* rpc, Entries* entries,
    const std::function<void(ModelControl*, ModelControl::Done)>& start) {
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(/*admin=*/true)) return reactor;
  if (control == nullptr) {
    call->Finish(NoModelControl(rpc));
    return reactor;
  }
  start(control, [call, rpc, entries](absl::StatusOr<std::vector<IndexEntry>> result) {
    call->Finish(Guarded(rpc, [&]() -> absl::Status {
      if (!result.ok()) return result.status();
      Fill(*result, entries);
      return absl::OkStatus();
    }));
  });
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* KrauseService::LoadModel(grpc::CallbackServerContext* ctx,
                                                   const v1::LoadModelRequest* request,
                                                   v1::LoadModelResponse* response) {
  return ControlCall(std::make_shared<UnaryCall>(edge_->gate, edge_->observer, edge_->request_log,
                                                 ctx, "LoadModel"),
                     ctx, edge_->control.load(), "LoadModel", response->mutable_versions(),
                     [request](ModelControl* c, ModelControl::Done done) {
                       c->Load(request->name(), request->version(), std::move(done));
                     });
}

grpc::ServerUnaryReactor* KrauseService::UnloadModel(grpc::CallbackServerContext* ctx,
                                                     const v1::UnloadModelRequest* request,
                                                     v1::UnloadModelResponse* response) {
  return ControlCall(std::make_shared<UnaryCall>(edge_->gate, edge_->observer, edge_->request_log,
                                                 ctx, "UnloadModel"),
                     ctx, edge_->control.load(), "UnloadModel", response->mutable_versions(),
                     [request](ModelControl* c, ModelControl::Done done) {
                       c->Unload(request->name(), request->version(), std::move(done));
                     });
}

grpc::ServerUnaryReactor* KrauseService::RepositoryIndex(grpc::CallbackServerContext* ctx,
                                                         const v1::RepositoryIndexRequest* request,
                                                         v1::RepositoryIndexResponse* response) {
  UnaryCall call(edge_->gate, edge_->observer, edge_->request_log, ctx, "RepositoryIndex");
  if (!call.Enter(/*admin=*/true)) return call.reactor();
  call.Finish(Guarded("RepositoryIndex", [&] {
    Fill(IndexOf(edge_->control.load(), *edge_->registry.load(), request->ready_only()),
         response->mutable_models());
    return absl::OkStatus();
  }));
  return call.reactor();
}

}  // namespace krause::server
