// A generation streamed to its client, whatever the protocol: the receiver of its images' updates
// from the generator's worker and the owner of its stream state (a GenerateStream), shared by the
// streaming front ends (krause.v1's Generate over gRPC, the Open Inference Protocol's
// generate_stream over HTTP). A front end derives from it and supplies two things: how a chunk is
// written (WriteChunk: build its message or events, start the write, call WriteDone when it is
// written) and how the call ends (EndCall, through the call's book).
//
// The path is one way: the worker hands each iteration's CallUpdate to OnUpdate (worker thread),
// which records it in the stream and, when a chunk is due, posts Flush to the reply pool; Flush
// encodes the chunk's finished images (PNG) and hands it to WriteChunk; WriteDone flushes what
// accumulated meanwhile. Every way the call can stop early (the deadline, the client leaving, a
// flush that failed) goes down one path, StopImages(), which tells the worker to cancel the
// call's images.
//
// Ownership: held by shared_ptr: the front end's own reference, the worker's (until the last
// image is done) and each posted flush's. Nothing else points at it.
// Thread-safety: mu_ guards the stream; the chunk handed to WriteChunk belongs to that write
// until WriteDone (the stream writes one chunk at a time).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/core/generate_stream.h"
#include "server/core/generator_worker.h"
#include "server/core/operations.h"
#include "server/core/served_model.h"
#include "server/edge/call_book.h"
#include "server/edge/front_end.h"

namespace krause::server {

class StreamedGeneration : public GenerationReceiver,
                           public std::enable_shared_from_this<StreamedGeneration> {
 public:
  void OnUpdate(const CallUpdate& update) final;  // worker thread

 protected:
  // A finished image of a chunk, encoded.
  struct EncodedImage {
    int64_t image = 0;
    uint64_t seed = 0;
    std::string png;
  };

  StreamedGeneration(const FrontEndContext* edge, const char* protocol);
  ~StreamedGeneration() override = default;

  // After the book entered the gate: finds the generator `name` at `version` ("" for the
  // default generator, or the newest version), then `parse` turns the request into a plan and
  // stream parameters; the images are submitted and the stream runs until the call ends
  // (through EndCall). An error: nothing was submitted and the caller finishes the call with it.
  absl::Status Submit(
      const std::string& name, const std::string& version,
      const std::function<absl::StatusOr<ParsedGenerate>(const ServedModel&)>& parse,
      Clock::time_point deadline);

  // The front end's write of the last chunk ended (ok: written); then whatever is due goes out.
  void WriteDone(bool ok);
  // The client left: the images stop at the next decode step, the call ends CANCELLED.
  void ClientGone();
  // Finishes the call exactly once, through the book (and so EndCall).
  void FinishCall(const absl::Status& status);

  // The front end writes `chunk` with its encoded images (reply pool or the front end's thread)
  // and calls WriteDone when the write has ended. Whatever it throws ends the call with INTERNAL.
  virtual void WriteChunk(GenerateStream::Chunk& chunk, std::vector<EncodedImage> images) = 0;
  // The call's end, once: OK after the last chunk was written, or the error.
  virtual void EndCall(const grpc::Status& status) = 0;

  CallBook& book() { return book_; }
  const ServedModel& model() const { return *model_; }
  const FrontEndContext* edge() const { return edge_; }

 private:
  // The book finishes the call through an object with Finish(grpc::Status).
  struct Ender {
    StreamedGeneration* call;
    void Finish(const grpc::Status& st) { call->EndCall(st); }
  };
  void Flush();
  void FlushOnce();
  std::vector<EncodedImage> Encode(GenerateStream::Chunk& chunk);
  void StopImages();

  const FrontEndContext* const edge_;
  CallBook book_;
  ServedModel* model_ = nullptr;  // set before the images are submitted (the book holds it)

  mutable std::mutex mu_;
  std::optional<GenerateStream> stream_;  // set before the images are submitted
  bool worker_stopping_ = false;          // an update said the worker is stopping
};

}  // namespace krause::server
