// The one collector of a generation, whatever the protocol and however it answers: the receiver
// of its images' updates from the generator's worker and the owner of its state (a
// GenerateStream), for every front end that generates (krause.v1's Generate over gRPC, the HTTP
// generation, the Open Inference Protocol's infer). The plan's output mode says what goes out:
// rows as they complete, progress, or (kFinal) one chunk with every image at the end. A front end
// derives from it and supplies two things: how a chunk is written (WriteChunk: build its message,
// events or answer, then call WriteDone when it is written) and how the call ends (EndCall, where
// it finishes its book).
//
// The path is one way: the worker hands each iteration's CallUpdate to OnUpdate (worker thread),
// which records it in the stream and, when a chunk is due, posts Flush to the reply pool; Flush
// encodes the chunk's finished images (PNG, or their pixels as they are) and hands it to
// WriteChunk; WriteDone flushes what accumulated meanwhile. Every way the call can stop early
// (the deadline, the client leaving, a flush that failed) goes down one path, StopImages(), which
// tells the worker to cancel the call's images. What the call did (its model, images, queue
// waits, FLOPs) goes to its book, which reports it once.
//
// Ownership: held by shared_ptr: the front end's own reference, the worker's (until the last
// image is done) and each posted flush's. Nothing else points at it. The book must outlive it.
// Thread-safety: mu_ guards the stream; the chunk handed to WriteChunk belongs to that write
// until WriteDone (the stream writes one chunk at a time).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/core/generate_settings.h"
#include "server/core/generate_stream.h"
#include "server/core/generator_worker.h"
#include "server/core/operations.h"
#include "server/core/registry.h"
#include "server/edge/call_book.h"
#include "server/edge/front_end.h"

namespace krause::server {

class GenerationCollector : public GenerationReceiver,
                            public std::enable_shared_from_this<GenerationCollector> {
 public:
  void OnUpdate(const CallUpdate& update) final;  // worker thread

 protected:
  // A finished image of a chunk: its PNG, or (a collector of pixels) its HWC subpixels.
  struct EncodedImage {
    int64_t image = 0;
    uint64_t seed = 0;
    std::string png;
    std::vector<uint8_t> pixels;
  };

  // `book` (the call's) must outlive the collector. `png`: finished images are encoded as PNG,
  // else handed over as pixels.
  GenerationCollector(const FrontEndContext* edge, CallBook* book, bool png = true)
      : edge_(edge), book_(book), png_(png) {}
  ~GenerationCollector() override = default;

  // After the book entered the gate: finds the generator `name` at `version` ("" for the
  // default generator, or the newest version), or takes `model` as found. Then the settings are
  // resolved against it (ResolveGenerate), the images submitted, and the collector runs until the
  // call ends (through EndCall). `deadline`: the call's (its settings' timeout may bring it
  // nearer); `cancelled`, when set, is polled at every update (a caller that cannot say it left).
  // An error: nothing was submitted and the caller finishes the call with it.
  absl::Status Submit(const std::string& name, const std::string& version,
                      const GenerateSettings& settings, Clock::time_point deadline);
  absl::Status Submit(ModelRef model, const GenerateSettings& settings, Clock::time_point deadline,
                      std::function<bool()> cancelled = {});

  // The front end's write of the last chunk ended (ok: written); then whatever is due goes out.
  void WriteDone(bool ok);
  // The client left: the images stop at the next decode step, the call ends CANCELLED.
  void ClientGone();
  // Ends the call exactly once, through EndCall (the queue wait noted in the book first).
  void FinishCall(const absl::Status& status);

  // The front end writes `chunk` with its encoded images (reply pool or the front end's thread)
  // and calls WriteDone when the write has ended. Whatever it throws ends the call with INTERNAL.
  virtual void WriteChunk(GenerateStream::Chunk& chunk, std::vector<EncodedImage> images) = 0;
  // The call's end, once: OK after the last chunk was written, or the error.
  virtual void EndCall(const absl::Status& status) = 0;

  CallBook& book() { return *book_; }
  const ServedModel& model() const { return *model_; }
  const GeneratePlan& plan() const { return plan_; }  // after Submit resolved it
  const FrontEndContext* edge() const { return edge_; }

 private:
  void Flush();
  void FlushOnce();
  std::vector<EncodedImage> Encode(GenerateStream::Chunk& chunk);
  void StopImages();

  const FrontEndContext* const edge_;
  CallBook* const book_;
  const bool png_;
  ServedModel* model_ = nullptr;  // set before the images are submitted (the book holds it)
  GeneratePlan plan_;             // the same (its images moved to the worker)
  std::function<bool()> cancelled_;
  bool gone_polled_ = false;  // the polled cancellation was seen (worker thread)

  mutable std::mutex mu_;
  std::optional<GenerateStream> stream_;  // set before the images are submitted
  bool worker_stopping_ = false;          // an update said the worker is stopping
};

}  // namespace krause::server
