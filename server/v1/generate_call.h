// One krause.v1 Generate call: the server-streaming reactor over the generation collector
// (server/edge/generation_collector.h: the stream state, the worker's updates, the flushes). This
// file adds what is gRPC's: the request read into the core's settings (requests.h), each chunk as
// a GenerateResponse message written with StartWrite, the client's cancel, and the call's end.
//
// Ownership: the call is held by shared_ptr: its own reference (gRPC's, dropped in OnDone), the
// worker's (until its last image is done) and each posted flush's. Nothing else points at it.
// Thread-safety: message_ belongs to the flush that got a chunk until its write is done.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "krause/v1/krause.grpc.pb.h"
#include "server/edge/front_end.h"
#include "server/edge/generation_collector.h"
#include "server/edge/grpc_call.h"

namespace krause::server {

class GenerateCall final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                           public GenerationCollector {
 public:
  // Enters the gate, validates and submits the images; on an error the call finishes at once.
  // Returns the reactor for gRPC.
  static grpc::ServerWriteReactor<v1::GenerateResponse>* Start(const FrontEndContext* edge,
                                                               grpc::CallbackServerContext* ctx,
                                                               const v1::GenerateRequest* request);

  void OnWriteDone(bool ok) override { WriteDone(ok); }
  void OnCancel() override { ClientGone(); }
  void OnDone() override { self_.reset(); }

 private:
  GenerateCall(const FrontEndContext* edge, grpc::CallbackServerContext* ctx)
      : GenerationCollector(edge, &book_),
        book_(edge->gate, edge->observer, edge->request_log, "Generate", kProtocolKrause),
        ctx_(ctx) {}
  void WriteChunk(GenerateStream::Chunk& chunk, std::vector<EncodedImage> images) override;
  void EndCall(const absl::Status& status) override { FinishGrpc(book_, ctx_, this, status); }

  CallBook book_;
  grpc::CallbackServerContext* const ctx_;

  std::shared_ptr<GenerateCall> self_;  // gRPC's reference, until OnDone
  v1::GenerateResponse message_;        // the message being written (one write at a time)
};

}  // namespace krause::server
