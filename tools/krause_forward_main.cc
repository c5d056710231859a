// krause-forward: runs one model forward on tensors from a safetensors file and writes the
// logits to another. For checking converted checkpoints against PyTorch and for debugging.
//
//   krause-forward MODEL.safetensors INPUT.safetensors OUTPUT.safetensors [IMPL]
//
// MODEL: a krause-serve checkpoint (config in __metadata__["config"]).
// INPUT: "images" float [B, C, H, W] (already normalised) for a ViT, or "pixels" int64 [B, T] for
// an ARM (model inputs, see model/pixel_model.h). OUTPUT: "logits". IMPL: auto (default),
// reference, windowed or fused_cpu.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <string>

#include "model/checkpoint/safetensors.h"
#include "model/loader.h"

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "krause-forward: %s\n", msg.c_str());
  return 1;
}

const at::Tensor* Find(const krause::NamedTensors& ts, const std::string& name) {
  for (const auto& [n, t] : ts)
    if (n == name) return &t;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr,
                 "usage: krause-forward MODEL.safetensors INPUT.safetensors OUTPUT.safetensors "
                 "[auto|reference|windowed|fused_cpu]\n");
    return argc == 2 ? 0 : 2;
  }
  krause::KrauseImpl impl = krause::KrauseImpl::kAuto;
  if (argc == 5) {
    const std::string s = argv[4];
    if (s == "reference")
      impl = krause::KrauseImpl::kReference;
    else if (s == "windowed")
      impl = krause::KrauseImpl::kWindowed;
    else if (s == "fused_cpu")
      impl = krause::KrauseImpl::kFusedCpu;
    else if (s != "auto")
      return Fail("unknown implementation " + s);
  }
  auto model = krause::LoadModel(argv[1]);
  if (!model.ok()) return Fail(model.status().ToString());
  auto input = krause::ReadSafetensors(argv[2]);
  if (!input.ok()) return Fail(input.status().ToString());
  at::NoGradGuard no_grad;
  at::Tensor logits;
  if (model->classifier()) {
    const at::Tensor* images = Find(input->tensors, "images");
    if (!images) return Fail("input has no tensor \"images\"");
    logits = model->vit->Forward(images->to(at::kFloat), impl);
  } else {
    const at::Tensor* pixels = Find(input->tensors, "pixels");
    if (!pixels) return Fail("input has no tensor \"pixels\"");
    logits = model->pixel->Forward(pixels->to(at::kLong), impl);
  }
  auto st = krause::WriteSafetensors(argv[3], {{"logits", logits.contiguous()}}, {});
  if (!st.ok()) return Fail(st.ToString());
  return 0;
}
