// krause.v1's Generate over HTTP, after the generate extension of Triton and KServe (their
// convention for streaming over Server-Sent Events), a route on the HTTP front door (protocol
// krause.v1-http) beside krause.v1 over Connect:
//   POST /v2/models/{model}[/versions/{v}]/generate_stream   text/event-stream, one event per row
//   POST /v2/models/{model}[/versions/{v}]/generate          the same call answered as one JSON
// The body is a JSON object with krause.v1 GenerateRequest's settings under the same names (each
// optional; v1/generate_body.h reads it): num_images, seed, temperature, top_p, top_k, guidance,
// label or class_index, prompt_png (a base64 PNG, a data: URL too) with prompt_rows,
// update_interval_ms, stream_rows, first_image, and timeout (microseconds, as the infer's
// `timeout` parameter). They may also sit in a "parameters" object. The settings are the core's
// (GenerateSettings), resolved as krause.v1's Generate resolves them, so the same settings give
// the same bytes; /generate is the same call with the final output.
//
// The stream: `data: {json}` events, each with a "type":
//   start   model_name, model_version, seed, first_image, num_images, height, width, channels
//   row     model_name, model_version, image, row, pixels (the row's subpixels, HWC order)
//   progress  pixels_done, pixels_total, images_done, images_total, waiting (with stream_rows
//           false only: the rows are the progress otherwise)
//   image   model_name, model_version, image, seed, png (base64), flops_executed,
//           flops_dense_equivalent (the image's own)
//   done    "done": true, model_name, model_version, images, pixels_generated, seconds,
//           seconds_to_first_pixel, seed, flops_executed, flops_dense_equivalent (the call's)
// and, for a failure after the stream began, `event: error` with data {"type": "error",
// "error": message, "code": the gRPC code's name, "status": its HTTP status}, then the end.
// Before the stream (bad input, an unknown model, a refusal) the answer is the REST API's JSON
// error with its HTTP status. `: ping` comments keep an idle stream open through proxies. A
// client that leaves cancels its images at the next decode step.
// Thread-safety: the route's handler on a loop thread; the rest runs on the reply pool.
#pragma once

#include <cstdint>

#include "server/edge/front_end.h"
#include "server/edge/http_front_door.h"

namespace krause::server {

struct HttpGenerationOptions {
  int ping_ms = 15000;           // a `: ping` comment after this long without events
  int64_t deadline_ms = 600000;  // the call's deadline unless its timeout is nearer (0: none)
  int64_t max_backlog_bytes = int64_t{16} << 20;  // a client this far behind is dropped
};

// The route of /v2/models/{model}[/versions/{v}]/generate and /generate_stream: each request
// enters the gate, its body is read and the images of the model submitted; a failing step is
// answered as the REST API's JSON error, else the images stream (or are answered once) until the
// call ends. `edge` must outlive the front door.
HttpRoute HttpGenerationRoute(const FrontEndContext* edge, const HttpGenerationOptions& options);

}  // namespace krause::server
