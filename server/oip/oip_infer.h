// An Open Inference Protocol inference (oip.h's native types) run on the served models, for both
// OIP front ends: the request is checked against the model's tensor contract (oip.h), then
// converted to the same operations of the core a krause.v1 call uses (core/operations.h):
// Classify (OIP and krause.v1 requests share batches), Score, or a generation: its parameters
// read into the core's GenerateSettings, resolved by ResolveGenerate (the same defaults, and the
// same seed gives the same images as krause.v1's Generate) and answered once by the generation
// collector's final output (edge/generation_collector.h). Every check happens before anything is
// queued; each error is InvalidArgument naming the tensor or parameter and what it
// must be (NOT_FOUND for an unknown model or version).
// Thread-safety: StartInfer from any thread; `done` runs on a model thread or the reply pool.
#pragma once

#include <chrono>
#include <functional>

#include "absl/status/statusor.h"
#include "server/core/operations.h"
#include "server/core/registry.h"
#include "server/core/reply_pool.h"
#include "server/edge/call_book.h"
#include "server/edge/front_end.h"
#include "server/oip/oip.h"

namespace krause::server::oip {

// What a call brings to its inference; everything must outlive the call's `done`.
struct InferContext {
  const FrontEndContext* edge = nullptr;  // the reply pool, the fault hook
  CallBook* book = nullptr;  // the call's model, images, queue waits and FLOPs (reported once)
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::function<bool()> cancelled;  // polled while queued and while generating; may be empty
};

using InferDone = std::function<void(absl::StatusOr<InferResponse>)>;

// Checks `request` and queues its work. OK: `done` runs exactly once, later or (an idle
// classifier runs at once) before this returns. An error: nothing was queued and `done` never
// runs. A `timeout` parameter (microseconds, as Triton's; 0: none) brings the call's deadline
// nearer: past it the work stops and the call ends with DEADLINE_EXCEEDED.
absl::Status StartInfer(const Registry& registry, InferRequest request, InferContext ctx,
                        InferDone done);

// The model's tensors (the contract above), with the versions served of its name.
ModelMetadata MetadataOf(const ServedModel& model, const std::vector<int64_t>& versions);

// The served model `name` at `version` (empty: the newest): NOT_FOUND naming the versions
// served (or InvalidArgument for an empty name).
absl::StatusOr<ModelRef> FindModel(const Registry& registry, const std::string& name,
                                   const std::string& version);

}  // namespace krause::server::oip
