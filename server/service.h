// krause.v1.KrauseService on gRPC's callback API: the handlers and the replies. Handlers check
// the request (requests.h turns it into native types) and hand work to the model's worker
// (ClassifyBatcher / GeneratorWorker); they run no model, except that a Classify may run its
// forward on the RPC thread when it arrives at an idle batcher (RunOnArrival,
// classify_batcher.h). The workers hand results to the service's ReplyPool, whose threads build
// the reply messages (PNG encoding included) and finish or write the calls, so a model thread
// does not serialise while work waits for it (a classify batcher with an empty queue replies
// itself: then the hop would only add latency). A Generate call is its own object
// (generate_call.h). Every call passes the Gate first: authentication, and refusal while loading
// or draining. Thread-safety: all handlers may run concurrently.
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "krause/v1/krause.grpc.pb.h"
#include "model/engine/inspect.h"
#include "server/call_book.h"
#include "server/gate.h"
#include "server/model_control.h"
#include "server/registry.h"
#include "server/reply_pool.h"
#include "server/request_log.h"
#include "server/requests.h"

namespace krause::server {

class KrauseService final : public v1::KrauseService::CallbackService {
 public:
  // fault_hook (tests only): called at named points of a call ("decode": before each request
  // image or prompt is decoded; "reply": before a Classify or Score reply is built; "flush":
  // before a Generate message is built), e.g. to throw and check that the call still ends with
  // INTERNAL, is counted and leaves the gate.
  explicit KrauseService(Gate* gate, CallObserver* observer = nullptr, int reply_threads = 1,
                         FaultHook fault_hook = nullptr)
      : gate_(gate), observer_(observer), fault_(std::move(fault_hook)), replies_(reply_threads) {}

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
  // A versioned repository's model control (null: a manifest or the flat layout, fixed at
  // start-up). Set once, when the models are loaded.
  void SetModelControl(ModelControl* control) { control_.store(control); }

  void Fault(const char* point) const {
    if (fault_) fault_(point);
  }
  const FaultHook& fault_hook() const { return fault_; }

  Gate* gate() const { return gate_; }
  CallObserver* observer() const { return observer_; }
  // Optional: one line per finished call (request_log.h). Set before serving.
  void SetRequestLog(RequestLog* log) { request_log_ = log; }
  RequestLog* request_log() const { return request_log_; }
  // The bound on an Inspect reply's listed keys (--inspect_max_entries). Set before serving.
  void SetInspectMaxEntries(int64_t n) { inspect_max_entries_ = n; }
  ReplyPool* replies() { return &replies_; }

 private:
  Gate* const gate_;
  CallObserver* const observer_;
  int64_t inspect_max_entries_ = defaults::kInspectMaxEntries;
  std::atomic<ModelControl*> control_{nullptr};
  RequestLog* request_log_ = nullptr;
  const FaultHook fault_;  // before replies_: its tasks may call it
  ReplyPool replies_;
};

}  // namespace krause::server
