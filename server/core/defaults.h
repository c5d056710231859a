// The serving defaults, each written once: the manifest's per-model keys (ModelSpec), the
// classify batcher and its scheduling (BatchingOptions, ClassifyPlanOptions, ClassifyArrival) and
// the generator worker (GeneratorOptions) all start from these. The decode engine's own default
// slot count (EngineOptions::max_sequences, in model/, which cannot see server/) is checked
// against kMaxSequences where the server builds its engines (registry.cc).
#ifndef KRAUSE_SERVER_DEFAULTS_H_
#define KRAUSE_SERVER_DEFAULTS_H_

#include <cstdint>

namespace krause::server::defaults {

// Classifiers: images per batch; a request is never split, so also the most per request.
inline constexpr int64_t kMaxBatchSize = 64;
// Classifiers: images queued for the batcher; beyond, Classify answers UNAVAILABLE.
inline constexpr int64_t kMaxQueuedImages = 1024;
// Generators: cache slots (sequences in one decode step; a guided image takes two).
inline constexpr int64_t kMaxSequences = 64;
// Generators: images waiting for a slot; beyond, Generate and Score answer UNAVAILABLE.
inline constexpr int64_t kMaxWaiting = 256;
// Generators: images per Generate / Score request when the manifest sets none.
inline constexpr int64_t kGeneratorImagesPerRequest = 16;
// Inspect: the most keys a reply lists (queries x heads x keys per query, over its layers; about
// 6 bytes each on the wire). A whole image of the bundled KARM (784 positions, 3 layers, 2 heads,
// 40 keys) is 188,160.
inline constexpr int64_t kInspectMaxEntries = 262144;
// The longest timeout a call may set for itself (microseconds, as Triton's `timeout` parameter,
// the Open Inference Protocol's infer and the HTTP generation's body): a day.
inline constexpr int64_t kMaxTimeoutMicroseconds = int64_t{24} * 3600 * 1000000;

}  // namespace krause::server::defaults

#endif  // KRAUSE_SERVER_DEFAULTS_H_
