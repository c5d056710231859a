// A small pool of threads that build and send replies: protobuf messages, PNG encoding and the
// reactor calls that finish or write a call. The model threads (classify batchers, generator
// workers) hand their results here and go back to the next batch or step at once, instead of
// spending their time on serialisation while the model waits.
//
// Tasks run in the order posted when the pool has one thread (the default), in parallel
// otherwise. A task must not block on the model threads. Exceptions a task throws are caught
// and reported on stderr (the task's call is then finished by nobody: tasks catch their own).
// The destructor runs every task still queued, then joins.
// Thread-safety: Post from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace krause::server {

class ReplyPool {
 public:
  explicit ReplyPool(int threads = 1);
  ~ReplyPool();
  ReplyPool(const ReplyPool&) = delete;
  ReplyPool& operator=(const ReplyPool&) = delete;

  void Post(std::function<void()> task);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace krause::server
