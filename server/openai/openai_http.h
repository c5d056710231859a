// OpenAI's Images API on the HTTP port (a route of the front door, edge/http_front_door.h,
// protocol label "openai"), so that the official SDKs, gateways and tools that speak it reach
// the generators with a base_url:
//   GET  /v1/models               every served model in the API's list shape
//   POST /v1/images/generations   JSON (images_request.h): the images of one class, answered as
//                                 {created, data: [{b64_json, seed}], usage}; with stream: true
//                                 as Server-Sent Events: image_generation.partial_image (up to
//                                 partial_images per image as its rows arrive), then
//                                 image_generation.completed per image
//   POST /v1/images/edits         multipart/form-data: the same parameters plus the image and an
//                                 optional mask; a completion of the image's rows above the
//                                 mask's transparent bottom band, answered the same way
//                                 (image_edit.* events when streamed)
// Through the one request path of the core: the request's settings (GenerateSettings) resolved
// by ResolveGenerate and collected by the generation collector's final output, so the PNGs are
// byte-identical to krause.v1 Generate's for the same settings and seed. Errors are the API's
// {"error": {"message", "type", "param", "code"}} with the HTTP status the SDKs map to their
// typed errors (400, 401, 404, 429, 503, ...). Tokens, deadlines (--http_deadline_seconds),
// cancellation when the client leaves, metrics and the request log as every other front end.
// Thread-safety: the route's handler runs on the loop threads; answers are written from the
// reply pool.
#pragma once

#include <cstdint>

#include "server/edge/front_end.h"
#include "server/edge/http_route.h"

namespace krause::server {

struct OpenAiOptions {
  int64_t deadline_ms = 600000;                   // a call's deadline (0: none)
  int ping_ms = 15000;                            // a `: ping` comment on a stream this idle
  int64_t max_backlog_bytes = int64_t{16} << 20;  // a streamed client this far behind is dropped
};

// The route of /v1/; `edge` must outlive the front door.
HttpRoute OpenAiRoute(const FrontEndContext* edge, const OpenAiOptions& options);

}  // namespace krause::server
