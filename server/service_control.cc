// KrauseService's model-control calls (LoadModel, UnloadModel, RepositoryIndex): admin calls
// through the gate, carried out by ModelControl on its thread; the reply is finished from there.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/service.h"
#include "server/status.h"

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

// Without a repository: the served models, each READY (nothing can change them).
std::vector<IndexEntry> ServedIndex(const Registry& registry) {
  std::vector<IndexEntry> out;
  for (const ModelRef& m : registry.models())
    out.push_back({m->name(), m->info().version, VersionState::kReady, ""});
  return out;
}

absl::Status NoRepository(const char* rpc) {
  return absl::FailedPreconditionError(absl::StrCat(
      rpc,
      " needs a versioned repository in --models_dir and --model_control explicit (this "
      "server's models are fixed at start-up)"));
}

}  // namespace

grpc::ServerUnaryReactor* KrauseService::LoadModel(grpc::CallbackServerContext* ctx,
                                                   const v1::LoadModelRequest* request,
                                                   v1::LoadModelResponse* response) {
  auto call = std::make_shared<UnaryCall>(gate_, observer_, request_log_, ctx, "LoadModel");
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(ctx, /*admin=*/true)) return reactor;
  ModelControl* control = control_.load();
  if (control == nullptr) {
    call->Finish(NoRepository("LoadModel"));
    return reactor;
  }
  control->Load(request->name(), request->version(),
                [call, response](absl::StatusOr<std::vector<IndexEntry>> entries) {
                  call->Finish(Guarded("LoadModel", [&]() -> absl::Status {
                    if (!entries.ok()) return entries.status();
                    Fill(*entries, response->mutable_versions());
                    return absl::OkStatus();
                  }));
                });
  return reactor;
}

grpc::ServerUnaryReactor* KrauseService::UnloadModel(grpc::CallbackServerContext* ctx,
                                                     const v1::UnloadModelRequest* request,
                                                     v1::UnloadModelResponse* response) {
  auto call = std::make_shared<UnaryCall>(gate_, observer_, request_log_, ctx, "UnloadModel");
  grpc::ServerUnaryReactor* reactor = call->reactor();
  if (!call->Enter(ctx, /*admin=*/true)) return reactor;
  ModelControl* control = control_.load();
  if (control == nullptr) {
    call->Finish(NoRepository("UnloadModel"));
    return reactor;
  }
  control->Unload(request->name(), request->version(),
                  [call, response](absl::StatusOr<std::vector<IndexEntry>> entries) {
                    call->Finish(Guarded("UnloadModel", [&]() -> absl::Status {
                      if (!entries.ok()) return entries.status();
                      Fill(*entries, response->mutable_versions());
                      return absl::OkStatus();
                    }));
                  });
  return reactor;
}

grpc::ServerUnaryReactor* KrauseService::RepositoryIndex(grpc::CallbackServerContext* ctx,
                                                         const v1::RepositoryIndexRequest* request,
                                                         v1::RepositoryIndexResponse* response) {
  UnaryCall call(gate_, observer_, request_log_, ctx, "RepositoryIndex");
  if (!call.Enter(ctx, /*admin=*/true)) return call.reactor();
  call.Finish(Guarded("RepositoryIndex", [&] {
    ModelControl* control = control_.load();
    std::vector<IndexEntry> entries = control != nullptr ? control->Index(request->ready_only())
                                                         : ServedIndex(*gate_->registry());
    Fill(entries, response->mutable_models());
    return absl::OkStatus();
  }));
  return call.reactor();
}

}  // namespace krause::server
