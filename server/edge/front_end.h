// What every front end's calls share, whatever their protocol: the gate, the registry of served
// models, the call observer (the metrics), the request log, the reply pool where replies are
// built off the model threads, the bound on an Inspect reply, and the tests' fault hook.
// KrauseServer owns one and lends it to each front end (krause.v1, the Open Inference Protocol
// over gRPC and REST); no front end reaches another's service for these.
// Thread-safety: set up before serving, read-only afterwards (the pointees are thread-safe), but
// for `registry` and `control`, set once the models are loaded.
#pragma once

#include <atomic>
#include <cstdint>

#include "server/core/defaults.h"
#include "server/core/model_control.h"
#include "server/core/operations.h"
#include "server/core/reply_pool.h"
#include "server/edge/call_book.h"
#include "server/edge/gate.h"
#include "server/edge/model_stats.h"
#include "server/edge/request_log.h"

namespace krause::server {

class Registry;

struct FrontEndContext {
  Gate* gate = nullptr;
  // The served models: null while they load (the gate refuses calls until then), so a call that
  // entered the gate finds it set. Set once (hence atomic).
  std::atomic<const Registry*> registry{nullptr};
  // A versioned repository's model control (null: a manifest or the flat layout, fixed at
  // start-up). Set once, when the models are loaded (hence atomic).
  std::atomic<ModelControl*> control{nullptr};
  CallObserver* observer = nullptr;   // may be null
  RequestLog* request_log = nullptr;  // may be null
  const StatsBook* stats = nullptr;   // the statistics extension's figures; may be null
  ReplyPool* replies = nullptr;
  int64_t inspect_max_entries = defaults::kInspectMaxEntries;
  FaultHook fault;  // tests only; may be empty

  void Fault(const char* point) const {
    if (fault) fault(point);
  }
};

}  // namespace krause::server
