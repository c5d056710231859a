// The fused CPU prefill: validated fp32 tensors in, the ISA kernels of cpu_kernels.inc run over
// (batch, head, query block) work items on ATen's intra-op thread pool.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "model/attention/cpu_kernels.h"
#include "model/attention/cpu_scratch.h"
#include "model/attention/krause_attention.h"
#include "model/util/threads.h"

namespace krause::internal {

namespace {
constexpr int64_t kQueryBlock = 64;  // queries per work item
}  // namespace

KrauseResult FusedCpuAttention(const AttentionArgs& a, const KrauseOptions& o) {
  at::NoGradGuard no_grad;
  const at::Tensor q = a.q.contiguous(), k = a.k.contiguous(), v = a.v.contiguous();
  const int64_t bh = a.batch * a.heads, n = a.n, d = a.head_dim;
  const cpu::CpuKernelTable& kernels = cpu::CpuKernels();

  const bool grid = o.neighbourhood.kind == Neighbourhood::Kind::kGrid;
  // Transposed, padded keys [B*H, d, N + chunk] (the range kinds score runs of keys; a grid's
  // table rows read k directly) and key biases [B*H, N].
  const int64_t kt_stride = n + cpu::kScoreChunk;
  at::Tensor kt;
  if (!grid) {
    kt = at::zeros({bh, d, kt_stride}, q.options());
    kt.narrow(2, 0, n).copy_(k.view({bh, n, d}).transpose(1, 2));
  }
  at::Tensor bias = at::empty({bh, n}, q.options());
  {
    const float* kp = k.data_ptr<float>();
    float* bp = bias.data_ptr<float>();
    at::parallel_for(0, bh, GrainForWork(2.0 * n * d), [&](int64_t b0, int64_t b1) {
      for (int64_t s = b0; s < b1; ++s) kernels.key_biases(kp + s * n * d, n, d, bp + s * n);
    });
  }
  const at::Tensor inv_var = at::exp(-2.0 * a.log_sigma).contiguous();

  // Neighbourhood in kernel terms.
  int kind = 1;
  std::shared_ptr<const CandidateTable> table;
  switch (o.neighbourhood.kind) {
    case Neighbourhood::Kind::kCausal:
      kind = 0;
      break;
    case Neighbourhood::Kind::kGlobal:
      kind = 1;
      break;
    case Neighbourhood::Kind::kGrid:
      kind = 2;
      table = CachedCandidateTable(o.neighbourhood, n);
      break;
  }
  const int64_t max_cand = MaxCandidates(o.neighbourhood, n);

  KrauseResult r;
  r.out = at::empty_like(q);
  if (o.return_selection) {
    r.indices = at::empty({a.batch, a.heads, n, a.kept}, q.options().dtype(at::kLong));
    r.weights = at::empty({a.batch, a.heads, n, a.kept}, q.options());
  }
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* ktp = grid ? nullptr : kt.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  const float* ivp = inv_var.data_ptr<float>();
  float* op = r.out.data_ptr<float>();
  int64_t* sip = o.return_selection ? r.indices.data_ptr<int64_t>() : nullptr;
  float* swp = o.return_selection ? r.weights.data_ptr<float>() : nullptr;

  const int64_t blocks = (n + kQueryBlock - 1) / kQueryBlock;
  // Work per item: scores and aggregation of up to a block of queries over their candidates.
  const double item_flops = 4.0 * std::min(n, kQueryBlock) * max_cand * d;
  at::parallel_for(0, bh * blocks, GrainForWork(item_flops), [&](int64_t w0, int64_t w1) {
    const cpu::ScratchTensors scratch_tensors(max_cand);
    const cpu::Scratch& scratch = scratch_tensors.view();
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t s = w / blocks, blk = w % blocks;
      cpu::PrefillSlice slice{};
      slice.q = qp + s * n * d;
      slice.k = kp + s * n * d;
      slice.kt = ktp + s * d * kt_stride;
      slice.bias = bp + s * n;
      slice.v = vp + s * n * d;
      slice.inv_var = ivp[s % a.heads];
      slice.n = n;
      slice.d = d;
      slice.kt_stride = kt_stride;
      slice.top_k = o.top_k;
      slice.kind = kind;
      slice.window = o.neighbourhood.window;
      slice.table = table ? table->index.data() : nullptr;
      slice.table_count = table ? table->count.data() : nullptr;
      slice.table_width = table ? table->width : 0;
      slice.out = op + s * n * d;
      slice.sel_index = sip ? sip + s * n * a.kept : nullptr;
      slice.sel_weight = swp ? swp + s * n * a.kept : nullptr;
      slice.kept = a.kept;
      kernels.prefill(slice, blk * kQueryBlock, std::min(n, (blk + 1) * kQueryBlock), scratch);
    }
  });
  return r;
}

}  // namespace krause::internal
