// The reply pool: tasks run in the order posted on one thread, off the posting thread; the
// destructor runs what is still queued; a throwing task does not stop the others.
#include "server/core/reply_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace krause::server {
namespace {

TEST(ReplyPool, RunsTasksInOrderOffThePostingThread) {
  std::vector<int> order;
  std::promise<std::thread::id> ran_on;
  {
    ReplyPool pool(1);
    // The first task waits until everything is posted, so the rest really queue behind it.
    std::promise<void> posted;
    std::shared_future<void> all_posted = posted.get_future().share();
    pool.Post([&, all_posted] {
      all_posted.wait();
      ran_on.set_value(std::this_thread::get_id());
      order.push_back(0);
    });
    for (int i = 1; i < 100; ++i) pool.Post([&order, i] { order.push_back(i); });
    pool.Post([] { throw std::runtime_error("a failing reply"); });
    pool.Post([&order] { order.push_back(100); });
    posted.set_value();
  }  // the destructor drains the queue
  ASSERT_EQ(order.size(), 101u);
  for (int i = 0; i <= 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(ran_on.get_future().get(), std::this_thread::get_id());
}

TEST(ReplyPool, SeveralThreadsRunEveryTask) {
  std::atomic<int> done{0};
  {
    ReplyPool pool(3);
    EXPECT_EQ(pool.threads(), 3);
    for (int i = 0; i < 1000; ++i) pool.Post([&done] { done.fetch_add(1); });
  }
  EXPECT_EQ(done.load(), 1000);
  ReplyPool at_least_one(0);
  EXPECT_EQ(at_least_one.threads(), 1);
}

}  // namespace
}  // namespace krause::server
