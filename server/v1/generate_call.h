// One krause.v1 Generate call: the server-streaming reactor, the receiver of its images' updates
// from the generator's worker, and the owner of its stream state (a GenerateStream).
//
// The path is one way: the worker hands each iteration's CallUpdate to OnUpdate (worker thread),
// which records it in the stream and, when a message is due, posts Flush to the reply pool; Flush
// builds the message (PNGs included) and starts the write; OnWriteDone flushes what accumulated
// meanwhile. Every way the call can stop early (the deadline, the client leaving, a flush that
// failed) goes down one path, StopImages(), which tells the worker to cancel the call's images.
//
// Ownership: the call is held by shared_ptr: its own reference (gRPC's, dropped in OnDone), the
// worker's (until its last image is done) and each posted flush's. Nothing else points at it.
// Thread-safety: mu_ guards the stream; message_ belongs to the flush that got a kWrite until
// its write is done.
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "krause/v1/krause.grpc.pb.h"
#include "server/core/generate_stream.h"
#include "server/core/generator_worker.h"
#include "server/core/served_model.h"
#include "server/edge/call_book.h"
#include "server/edge/front_end.h"

namespace krause::server {

class GenerateCall final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                           public GenerationReceiver,
                           public std::enable_shared_from_this<GenerateCall> {
 public:
  // Enters the gate, validates and submits the images; on an error the call finishes at once.
  // Returns the reactor for gRPC.
  static grpc::ServerWriteReactor<v1::GenerateResponse>* Start(const FrontEndContext* edge,
                                                               grpc::CallbackServerContext* ctx,
                                                               const v1::GenerateRequest* request);

  void OnUpdate(const CallUpdate& update) override;  // worker thread
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override { self_.reset(); }

 private:
  explicit GenerateCall(const FrontEndContext* edge);
  absl::Status Begin(grpc::CallbackServerContext* ctx, const v1::GenerateRequest& request);
  // Sends what is due, or finishes the call once every image is done and the last message has
  // gone (reply pool, or gRPC's thread in OnWriteDone). PNGs are encoded outside the lock.
  void Flush();
  void FlushOnce();
  // The chunk as the message to write (PNG-encoding its finished images).
  void BuildMessage(GenerateStream::Chunk& chunk);
  void StopImages();
  // Finishes exactly once (the stream guarantees it for the streaming part).
  void FinishCall(const absl::Status& status);

  const FrontEndContext* const edge_;
  CallBook book_;
  std::shared_ptr<GenerateCall> self_;  // gRPC's reference, until OnDone
  ServedModel* model_ = nullptr;        // set before the images are submitted (the book holds it)

  mutable std::mutex mu_;
  std::optional<GenerateStream> stream_;  // set before the images are submitted
  bool worker_stopping_ = false;          // an update said the worker is stopping
  v1::GenerateResponse message_;          // the message being written (one write at a time)
};

}  // namespace krause::server
