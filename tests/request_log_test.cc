// Request log lines (server/edge/request_log.h): the exact JSON of a record, escaping of client
// metadata, and the file sink.
#include "server/edge/request_log.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace krause::server {
namespace {

TEST(RequestLog, ARecordIsOneJsonLineWithItsFieldsInOrder) {
  CallRecord r;
  r.rpc = "Classify";
  r.protocol = "krause.v1";
  r.model = "krause-vit-fmnist";
  r.version = "1";
  r.code = "OK";
  r.peer = "ipv4:127.0.0.1:5000";
  r.images = 4;
  r.seconds = 0.5;
  r.queue_seconds = 0.125;
  const absl::Time t = absl::FromUnixMillis(1796160000123);  // 2026-12-01T21:20:00.123Z
  EXPECT_EQ(
      FormatCallRecord(r, t),
      R"({"time":"2026-12-01T21:20:00.123Z","rpc":"Classify","protocol":"krause.v1","model":"krause-vit-fmnist","version":"1",)"
      R"("code":"OK","images":4,"seconds":0.5,"queue_seconds":0.125,"run_seconds":0.375,)"
      R"("peer":"ipv4:127.0.0.1:5000"})");
  // The caller's ids appear when sent; quotes, newlines and invalid UTF-8 cannot break the line.
  r.tenant = "team-a";  // the call's tenant, when it had one
  r.request_id = "a\"b\nc";
  r.traceparent = std::string("00-\xff-01");
  const std::string line = FormatCallRecord(r, t);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["tenant"], "team-a");
  EXPECT_EQ(j["request_id"], "a\"b\nc");
  EXPECT_EQ(j["traceparent"], "00-\xEF\xBF\xBD-01");  // U+FFFD replaces the bad byte
  // A wait longer than the call (clock granularity) never gives a negative run time.
  r.queue_seconds = 0.6;
  EXPECT_EQ(nlohmann::json::parse(FormatCallRecord(r, t))["run_seconds"], 0.0);
}

TEST(RequestLog, WritesLinesToItsFileAndRefusesAnUnwritablePath) {
  const std::string path = ::testing::TempDir() + "/request_log_test.jsonl";
  std::remove(path.c_str());
  {
    auto log = RequestLog::Open(path);
    ASSERT_TRUE(log.ok()) << log.status();
    CallRecord r;
    r.rpc = "Score";
    (*log)->Write(r);
    r.rpc = "Generate";
    (*log)->Write(r);
  }
  std::ifstream in(path);
  std::string a, b, c;
  ASSERT_TRUE(std::getline(in, a));
  ASSERT_TRUE(std::getline(in, b));
  EXPECT_FALSE(std::getline(in, c));
  EXPECT_EQ(nlohmann::json::parse(a)["rpc"], "Score");
  EXPECT_EQ(nlohmann::json::parse(b)["rpc"], "Generate");
  const auto bad = RequestLog::Open("/nonexistent-dir/log.jsonl");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--request_log /nonexistent-dir/log.jsonl"),
            std::string::npos);
}

}  // namespace
}  // namespace krause::server
