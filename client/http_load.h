// krause-loadgen's HTTP side (--protocol http): asynchronous HTTP/1.1 POSTs to the REST port over
// kept-alive connections (Boost.Beast over Asio), a few loop threads for any number of calls in
// flight. A call's answer is read whole, or, for a text/event-stream (generate_stream), event by
// event: the time to its first event and to its first pixels, the gaps between the chunks (the
// server's flushes) of a running stream, the images it received, and how it ended (its `done`
// event, or an `event: error`'s code). Thread-safety: Post from any thread; `done` runs on a loop
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace krause::client {

struct HttpCallResult {
  int http_status = 0;  // 0: no answer (connect, write or read failed)
  std::string code;     // the gRPC code the answer means ("OK", "UNAVAILABLE", ...)
  std::string error;    // what went wrong, for the report
  double seconds = 0;
  // Streams: seconds to the first event and to the first row or image event (-1: none), the
  // gaps between the chunks that followed the first pixels, and the images received.
  double first_event = -1, first_pixel = -1;
  std::vector<double> gaps;
  int64_t images = 0;
};

// The gRPC code name an HTTP status of the REST API stands for (docs/api.md's table, backwards).
std::string CodeOfHttpStatus(int status);

class HttpLoadClient {
 public:
  // `host_port`: the REST port; `token`: sent as a bearer token when not empty.
  HttpLoadClient(std::string host_port, std::string token, int threads = 2);
  ~HttpLoadClient();  // waits for nothing: call it when no call is in flight
  HttpLoadClient(const HttpLoadClient&) = delete;
  HttpLoadClient& operator=(const HttpLoadClient&) = delete;

  // POST `path` with `body` (JSON, or with `json_length` >= 0 the binary tensor data extension's
  // layout: the JSON's length goes in Inference-Header-Content-Length); `done` gets the result
  // once the answer has ended (a stream: at its end).
  void Post(const std::string& path, std::string body, std::function<void(HttpCallResult)> done,
            int64_t json_length = -1);

  struct Impl;  // http_load.cc's

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace krause::client
