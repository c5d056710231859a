// What a gRPC call adds to its book (call_book.h): its deadline on the workers' clock, its entry
// through the gate (the "authorization" metadata; the caller's x-request-id and traceparent echoed
// in the initial metadata), and its end, where the status becomes gRPC's (edge/status.h's
// ToGrpcStatus) and a refusal's RetryInfo also gRPC's own pushback, which the clients' retry
// policy honours: retry at once on another replica when draining, after the delay when full.
// Thread-safety: as the book's; the context must outlive the call's end.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "server/edge/call_book.h"
#include "server/edge/status.h"

namespace krause::server {

// The call's deadline on the steady clock (max when it has none).
inline std::chrono::steady_clock::time_point SteadyDeadline(
    const grpc::CallbackServerContext* ctx) {
  using Clock = std::chrono::steady_clock;
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  const auto left = d - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

// Enters the gate for a gRPC call (an admin call: model control).
inline absl::Status EnterGrpc(CallBook& book, grpc::CallbackServerContext* ctx,
                              bool admin = false) {
  // The caller's request ids go back in the initial metadata (nothing is sent yet) and into the
  // request log.
  const auto& md = ctx->client_metadata();
  std::string ids[2];
  const char* keys[2] = {"x-request-id", "traceparent"};
  for (int i = 0; i < 2; ++i) {
    const auto it = md.find(keys[i]);
    if (it == md.end()) continue;
    ids[i].assign(it->second.data(), std::min<size_t>(it->second.size(), 256));
    ctx->AddInitialMetadata(keys[i], ids[i]);
  }
  std::optional<std::string_view> authorization;
  if (const auto it = md.find("authorization"); it != md.end())
    authorization = std::string_view(it->second.data(), it->second.size());
  return book.Enter(authorization, std::move(ids[0]), std::move(ids[1]), ctx->peer(), admin);
}

// Finishes the call through its book; `reactor` is any gRPC reactor (Finish(grpc::Status)).
template <typename Reactor>
void FinishGrpc(CallBook& book, grpc::CallbackServerContext* ctx, Reactor* reactor,
                const absl::Status& status) {
  book.Finish(status, [ctx, reactor](const absl::Status& st) {
    if (!st.ok()) {
      const ErrorDetails d = DetailsOf(st);
      if (d.retry_delay)
        ctx->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(d.retry_delay->count()));
    }
    reactor->Finish(ToGrpcStatus(st));
  });
}

// A unary call on gRPC's default reactor, with its book.
class UnaryCall {
 public:
  UnaryCall(Gate* gate, CallObserver* observer, RequestLog* log, grpc::CallbackServerContext* ctx,
            const char* rpc, const char* protocol = kProtocolKrause)
      : book_(gate, observer, log, rpc, protocol), ctx_(ctx), reactor_(ctx->DefaultReactor()) {}

  // Enters the gate; on refusal finishes the call and returns false.
  bool Enter(bool admin = false) {
    const absl::Status st = EnterGrpc(book_, ctx_, admin);
    if (!st.ok()) Finish(st);
    return st.ok();
  }
  CallBook* book() { return &book_; }
  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  void Finish(const absl::Status& st) { FinishGrpc(book_, ctx_, reactor_, st); }

 private:
  CallBook book_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ServerUnaryReactor* reactor_;
};

}  // namespace krause::server
