// Loading a krause-serve checkpoint (safetensors with the model config in __metadata__["config"])
// into the model it describes: a ViT (Krause or softmax) or an ARM (KARM or softmax ARM).
// Thread-safety: free functions; the returned models are immutable and may be shared by threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/pixel_model.h"
#include "model/vit.h"

namespace krause {

struct LoadedModel {
  std::string path;
  std::map<std::string, std::string> metadata;  // the checkpoint's __metadata__
  // Exactly one is set.
  std::shared_ptr<const ViT> vit;
  std::shared_ptr<const PixelModel> pixel;

  bool classifier() const { return vit != nullptr; }
  AttentionCost FlopsPerImage() const {
    return vit ? vit->FlopsPerImage() : pixel->FlopsPerImage();
  }
  int64_t NumParameters() const {
    return vit ? vit->parameters().NumParameters() : pixel->parameters().NumParameters();
  }
};

// Reads `path`, builds the model its config describes and loads the weights strictly, on
// `device` ("cpu", "cuda", "cuda:N"). NotFound / InvalidArgument / FailedPrecondition (no CUDA)
// with the path in the message. `linear_dtype` kBFloat16 serves the model with bfloat16 linear
// weights (ParameterStore::RoundLinear: every implementation computes with the rounded weights;
// the packed CPU paths read half the bytes); kFloat (the default) leaves them as trained.
absl::StatusOr<LoadedModel> LoadModel(const std::string& path, const std::string& device = "cpu",
                                      at::ScalarType linear_dtype = at::kFloat);
// A linear_dtype by name: "float32" (kFloat) or "bfloat16" (kBFloat16); InvalidArgument
// "`what` must be float32 or bfloat16, got \"NAME\"" otherwise (the tools' --weights_dtype).
absl::StatusOr<at::ScalarType> ParseLinearDtype(const std::string& name, const std::string& what);

// Writes a model with its config (and `metadata`) as a checkpoint LoadModel reads.
absl::Status SaveModel(const std::string& path, const ViT& model,
                       std::map<std::string, std::string> metadata = {});
absl::Status SaveModel(const std::string& path, const PixelModel& model,
                       std::map<std::string, std::string> metadata = {});

}  // namespace krause
