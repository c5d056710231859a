#include "model/engine/decode_graphs.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/util/tensor_checks.h"

// Graphs need LibTorch 2.x's thread-local capture mode (see Supported()) and, for the clean-up
// of a failed capture, the allocator's pool calls of 2.1 and later.
#if defined(KRAUSE_WITH_CUDA) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
#define KRAUSE_CUDA_GRAPHS 1
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace krause {

struct DecodeGraphs::Graph {
#ifdef KRAUSE_CUDA_GRAPHS
  at::cuda::CUDAGraph graph;
#endif
  at::Tensor logits;  // the step's output, in the graphs' pool
};

#ifdef KRAUSE_CUDA_GRAPHS
namespace {
using PoolId = decltype(at::cuda::graph_pool_handle());

// Leaves stream capture after a failed capture, so that the stream works eagerly again.
void AbandonCapture() {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr) {
      cudaGraphDestroy(graph);
    }
  }
  (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
}

// Ends a capture that failed (the step threw while capturing, or capture_end itself threw) so
// that the stream and the allocator work eagerly again. CUDAGraph::capture_end stops the
// allocator routing the stream's allocations into the graphs' pool only after
// cudaStreamEndCapture succeeds, and the graph releases its use of the pool on destruction only
// if it got that far: when capture_end throws before, both are done here, else the pool keeps
// taking this thread's allocations and is never freed. `pool` is the id the capture began with
// (CUDAGraph::pool() refuses to answer without a successful capture).
void EndFailedCapture(at::cuda::CUDAGraph& graph, const PoolId& pool) {
  try {
    graph.capture_end();
    return;  // ended cleanly (and the graph releases the pool when destroyed)
  } catch (const std::exception&) {
  }
  AbandonCapture();
  const c10::DeviceIndex device = c10::cuda::current_device();
  bool was_allocating = true;
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (const std::exception&) {
    was_allocating = false;  // capture_end got past it: the graph's destructor releases the pool
  }
  if (!was_allocating) return;
  try {
    c10::cuda::CUDACachingAllocator::releasePool(device, pool);
  } catch (const std::exception&) {
    // (Only an allocator whose books disagree throws here; the step then runs eagerly anyway.)
  }
}
}  // namespace
#endif

bool DecodeGraphs::Supported(const PixelModel& model) {
#ifdef KRAUSE_CUDA_GRAPHS
  return model.device().is_cuda() && model.config().attention == AttentionKind::kKrause;
#else
  (void)model;
  return false;
#endif
}

DecodeGraphs::DecodeGraphs(const PixelModel* model, PixelKvCache* cache,
                           const PixelDecodeWeights* packed, int64_t max_sequences)
    : model_(model), cache_(cache), packed_(packed) {
  if (!Supported(*model)) {
    reason_ = "CUDA graphs need a KARM on a GPU, in a CUDA build against LibTorch 2.1 or later";
    return;
  }
  if (packed == nullptr || static_cast<int64_t>(packed->scales.size()) != model->config().depth) {
    reason_ = "CUDA graphs need the model's decode scales (PackForDecode, engine/cpu_decoder.h)";
    return;
  }
#ifdef KRAUSE_CUDA_GRAPHS
  const auto opts = at::TensorOptions().dtype(at::kLong).device(model->device());
  u_ = at::zeros({max_sequences}, opts);
  positions_ = at::zeros({max_sequences}, opts);
  slots_ = at::zeros({max_sequences}, opts);
  pool_ = std::make_shared<PoolId>(at::cuda::graph_pool_handle());
  enabled_ = true;
#else
  (void)max_sequences;
#endif
}

DecodeGraphs::~DecodeGraphs() = default;

at::Tensor DecodeGraphs::Step(const at::Tensor& u, const at::Tensor& positions,
                              const at::Tensor& slots) {
  if (!enabled_) {
    ++eager_steps_;
    return model_->DecodeStep(u, positions, slots, cache_, packed_);
  }
  const int64_t s = u.size(0);
  TORCH_CHECK(s >= 1 && s <= u_.size(0), "a graphed decode step takes 1..", u_.size(0),
              " sequences, got ", s);
  const at::Tensor u_d = u_.narrow(0, 0, s), pos_d = positions_.narrow(0, 0, s),
                   slots_d = slots_.narrow(0, 0, s);
  auto index = DecodeIndex::Adopt(slots, positions, cache_->slots(), slots_d, pos_d);
  TORCH_CHECK(index.ok(), index.status().ToString());
  // The step's (validated) inputs into the fixed buffers every graph reads, ordered on the
  // current stream before the replay or the eager step that reads them.
  u_d.copy_(u, /*non_blocking=*/true);
  pos_d.copy_(positions, true);
  slots_d.copy_(slots, true);

  if (auto it = graphs_.find(s); it != graphs_.end()) {
#ifdef KRAUSE_CUDA_GRAPHS
    it->second->graph.replay();
#endif
    ++replays_;
    return it->second->logits;
  }
  if (seen_[s]++ == 0) {  // first step of this size: eager (and the warm-up)
    ++eager_steps_;
    return model_->DecodeStep(u_d, *index, cache_, packed_);
  }
#ifdef KRAUSE_CUDA_GRAPHS
  auto graph = std::make_unique<Graph>();
  try {
    graph->graph.capture_begin(*static_cast<const PoolId*>(pool_.get()),
                               cudaStreamCaptureModeThreadLocal);
    graph->logits = model_->DecodeStep(u_d, *index, cache_, packed_);
    graph->graph.capture_end();
  } catch (const std::exception& e) {
    // Nothing of the step ran (a capture records work without running it): end the capture
    // (EndFailedCapture: the stream and the allocator's pool), then run the step eagerly and
    // leave graphs off.
    EndFailedCapture(graph->graph, *static_cast<const PoolId*>(pool_.get()));
    graph.reset();
    enabled_ = false;
    reason_ = absl::StrCat("capturing the decode step of ", s,
                           " sequences failed: ", ExceptionMessage(e));
    graphs_.clear();
    ++eager_steps_;
    return model_->DecodeStep(u_d, *index, cache_, packed_);
  }
  graph->graph.replay();  // the capture recorded the step; this runs it
  ++replays_;
  const at::Tensor logits = graph->logits;
  graphs_.emplace(s, std::move(graph));
  return logits;
#else
  ++eager_steps_;
  return model_->DecodeStep(u_d, *index, cache_, packed_);
#endif
}

}  // namespace krause
