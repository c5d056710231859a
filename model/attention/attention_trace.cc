#include "model/attention/attention_trace.h"

namespace krause {

AttentionTrace::Layer* AttentionTrace::Begin(AttentionTrace* trace, int64_t layer,
                                             const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v) {
  if (trace == nullptr || !trace->Wants(layer)) return nullptr;
  Layer* record = &trace->recorded.emplace_back();
  record->layer = layer;
  if (trace->keep_inputs) record->q = q, record->k = k, record->v = v;
  return record;
}

void AttentionTrace::RecordSelection(Layer* record, const KrauseResult& result,
                                     const at::Tensor& log_sigma, int64_t heads, int64_t top_k) {
  record->indices = result.indices;
  record->weights = result.weights.detach();
  record->sigma = log_sigma.detach().reshape({-1}).exp().expand({heads}).contiguous();
  record->top_k = top_k;
}

}  // namespace krause
