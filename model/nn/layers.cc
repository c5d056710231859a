#include "model/nn/layers.h"

namespace krause::nn {

at::Tensor TruncNormal(at::IntArrayRef shape, double std, at::Generator& gen) {
  return at::normal(0.0, std, shape, gen).clamp(-2 * std, 2 * std).to(at::kFloat);
}

void AddLinear(ParameterStore* p, const std::string& prefix, int64_t in, int64_t out,
               at::Generator& gen) {
  p->Add(prefix + ".weight", TruncNormal({out, in}, 0.02, gen));
  p->Add(prefix + ".bias", at::zeros({out}));
  p->MarkLinear(prefix + ".weight");
}

void AddLayerNorm(ParameterStore* p, const std::string& prefix, int64_t dim) {
  p->Add(prefix + ".weight", at::ones({dim}));
  p->Add(prefix + ".bias", at::zeros({dim}));
}

}  // namespace krause::nn
