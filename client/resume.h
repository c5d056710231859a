// A Generate that survives the replica serving it: when the stream breaks (the replica died,
// drained, or one attempt ran past its own deadline), the images not yet finished are asked
// again as completions from the rows already received, with the call's seed and their own index
// (GenerateRequest.first_image)
// and the same model version and settings, on the next address of the channel. The server
// guarantees that such a completion is the uninterrupted image byte for byte (docs/api.md,
// "Resuming a stream"), so the caller sees one stream: every row once, in order, no gaps, and
// the same final images as an undisturbed call.
//
//   ResumeState      the plan as a pure state object: what to ask first, how each attempt's
//                    messages map onto the caller's stream, what to ask after a break, and
//                    when to give up. No gRPC calls, no clock of its own (tests drive it).
//   ResumingGenerate carries it out over a channel (gRPC's callback API; a blocking Read).
//
// Thread-safety: ResumeState none (ResumingGenerate holds it under its mutex); ResumingGenerate's
// Read/Finish/Cancel from one thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/connection.h"
#include "krause/v1/krause.grpc.pb.h"

namespace krause::client {

struct ResumeOptions {
  bool resume = true;  // false: a broken stream fails the call (plain Generate)
  // Breaks survived per call in all (each re-asks the images of the broken attempt).
  int max_resumes = 8;
  double deadline_seconds = 0;            // the whole call, resumes included; 0: none
  double attempt_timeout_seconds = 0;     // one attempt; past it, it is resumed elsewhere; 0: none
  std::chrono::milliseconds backoff{50};  // after a break without a RetryInfo: doubles
  std::chrono::milliseconds max_backoff{2000};
};

struct ResumeStats {
  int64_t attempts = 0;        // Generate calls made (the first included)
  int64_t resumed_calls = 0;   // calls made to continue a broken one ("resumed streams")
  int64_t images_resumed = 0;  // images asked again after a break
  int64_t rows_kept = 0;       // rows received before a break and sent back as the prompt
  // Rows a broken attempt had sampled (by its last progress report) but not delivered: they
  // are sampled again.
  int64_t rows_recomputed = 0;
  std::vector<std::string> breaks;  // each break: "peer: CODE: message"
};

class ResumeState {
 public:
  using Clock = std::chrono::steady_clock;

  struct Attempt {
    int id = 0;
    v1::GenerateRequest request;
    std::vector<int64_t> images;   // the caller's image index of the attempt's image j
    Clock::time_point not_before;  // start it then (backoff), not earlier
  };

  // `request` as the caller made it; its seed is fixed here when unset (`random_seed`), so that
  // a break can be resumed.
  ResumeState(v1::GenerateRequest request, const ResumeOptions& options, uint64_t random_seed,
              Clock::time_point now);

  // The first attempt.
  Attempt First();
  // A message of attempt `id`: the message for the caller (rows not delivered before, its
  // finished images under their own index), or nothing when it brings nothing new. A resumed
  // attempt whose GenerateStart.numerics differs from the first's ends the call
  // (FAILED_PRECONDITION, naming both: done()).
  std::optional<v1::GenerateResponse> OnMessage(int id, const v1::GenerateResponse& m,
                                                Clock::time_point now);
  // Attempt `id` ended. `timed_out`: it was stopped by its own attempt timeout. Returns the
  // attempts to make now (after a break), possibly none. Once done() the call is over.
  std::vector<Attempt> OnEnd(int id, const grpc::Status& status, const std::string& peer,
                             bool timed_out, Clock::time_point now);

  bool done() const { return done_; }
  // After done(): OK, or why the call failed.
  const grpc::Status& status() const { return status_; }
  // After done() with OK: the last message for the caller (its progress and the summary).
  v1::GenerateResponse Last(Clock::time_point now) const;
  const ResumeStats& stats() const { return stats_; }
  // The deadline of an attempt started now.
  std::optional<Clock::time_point> AttemptDeadline(Clock::time_point now) const;

 private:
  struct Image {
    std::string pixels;     // rows received, HWC (prompt rows included)
    int64_t rows = 0;       // rows received (delivered to the caller when it wants rows)
    bool finished = false;  // its PNG was delivered
    int attempt = 0;        // the attempt working on it now
  };
  struct Live {
    std::vector<int64_t> images;
    int64_t prompt_rows = 0;   // the attempt's prompt rows (the same for each of its images)
    uint64_t pixels_done = 0;  // its last progress
    uint32_t waiting = 0;
    std::map<int64_t, int64_t> sampled_rows;  // its images' rows received beyond its prompt
    bool first_seen = false;
  };
  Attempt Make(std::vector<int64_t> images, Clock::time_point not_before);
  v1::GenerateResponse Progress() const;
  int64_t RowLength() const { return int64_t{width_} * channels_; }

  const v1::GenerateRequest request_;
  const ResumeOptions options_;
  const bool want_rows_;
  const Clock::time_point start_;
  std::optional<Clock::time_point> deadline_;
  int64_t original_prompt_rows_ = 0;
  std::vector<Image> images_;
  std::map<int, Live> live_;
  int next_id_ = 0;
  int failures_ = 0;  // breaks in a row without progress, for the backoff
  // From the first message (GenerateStart): the version and shape every attempt uses.
  std::string model_, version_;
  // GenerateStart.numerics of the first attempt: a resumed attempt must say the same.
  std::string numerics_;
  uint32_t height_ = 0, width_ = 0, channels_ = 0;
  bool started_ = false;
  double first_pixel_seconds_ = -1;
  double flops_executed_ = 0, flops_dense_ = 0;
  bool done_ = false;
  grpc::Status status_;
  ResumeStats stats_;
};

class ResumingGenerate {
 public:
  // Starts the call. `stub` (and its channel) must outlive this object.
  ResumingGenerate(v1::KrauseService::Stub* stub, ConnectionOptions conn,
                   v1::GenerateRequest request, ResumeOptions options);
  ~ResumingGenerate();  // cancels what still runs and waits for it

  // The next message of the merged stream; false once it is over (then Finish).
  bool Read(v1::GenerateResponse* out);
  grpc::Status Finish();
  void Cancel();
  ResumeStats stats();

 private:
  class AttemptCall;
  void Start(ResumeState::Attempt a);  // mu_ held
  void OnMessage(int id, const v1::GenerateResponse& m);
  void OnEnd(AttemptCall* call, const grpc::Status& status);

  v1::KrauseService::Stub* const stub_;
  const ConnectionOptions conn_;
  std::mutex mu_;
  std::condition_variable cv_;
  ResumeState state_;
  std::deque<v1::GenerateResponse> out_;
  std::vector<ResumeState::Attempt> pending_;  // waiting for their not_before
  std::map<int, AttemptCall*> running_;
  bool cancelled_ = false, last_sent_ = false;
};

}  // namespace krause::client
