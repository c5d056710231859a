// krause.v1's unary methods, free of their transport: the request read and checked, the core's
// operation started, the response filled. The gRPC service (service.h) and the Connect protocol
// over HTTP (connect_http.h) run the same functions, so both give the same answers, limits and
// messages. Each Start* returns an error without queueing anything (`done` never runs), or OK,
// and then `done` runs exactly once, with the response filled when it is OK: later, on a model
// thread or the reply pool, or before Start* returns (ListModels, GetModel, a classifier that
// was idle). The call's book gets the model, images and queue wait.
// Thread-safety: from any thread; `request` is read before Start* returns; `response` and `book`
// must live until `done` has run.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "krause/v1/krause.pb.h"
#include "server/core/operations.h"
#include "server/edge/call_book.h"
#include "server/edge/front_end.h"

namespace krause::server {

// What a call brings to its work.
struct UnaryCallContext {
  const FrontEndContext* edge = nullptr;
  CallBook* book = nullptr;  // its model and images, for the request log and statistics
  CallLimits limits;         // its deadline, and whether its caller left
};

using UnaryDone = std::function<void(absl::Status)>;

absl::Status StartListModels(const UnaryCallContext& c, const v1::ListModelsRequest& request,
                             v1::ListModelsResponse* response, UnaryDone done);
absl::Status StartGetModel(const UnaryCallContext& c, const v1::GetModelRequest& request,
                           v1::ModelInfo* response, UnaryDone done);
absl::Status StartClassify(const UnaryCallContext& c, const v1::ClassifyRequest& request,
                           v1::ClassifyResponse* response, UnaryDone done);
absl::Status StartScore(const UnaryCallContext& c, const v1::ScoreRequest& request,
                        v1::ScoreResponse* response, UnaryDone done);
// Inspect: the model's attention on one image (model/engine/inspect.h), run by the model's
// batcher or worker beside its other work.
absl::Status StartInspect(const UnaryCallContext& c, const v1::InspectRequest& request,
                          v1::InspectResponse* response, UnaryDone done);

}  // namespace krause::server
