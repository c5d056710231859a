// Sample quality of a generator, judged by a classifier: what `krause-eval` reports.
//
// - SampleImages: images drawn with the decode engine (the serving path), image i from seed + i
//   and its own requested class.
// - ClassifierOutputs: a classifier's features (the head's input: the final LayerNorm's CLS
//   token) and class probabilities for a batch of uint8 images.
// - FrechetDistance: the Frechet distance between Gaussians fitted to two feature sets
//   (|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2)), unbiased covariances), in double
//   precision. With the bundled classifier's features it is this project's FID-like score; it
//   is not comparable with Inception-based FID figures.
//
// Thread-safety: free functions over immutable models.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/engine/sampling.h"
#include "model/pixel_model.h"
#include "model/precision.h"
#include "model/vit.h"

namespace krause {

// labels[i]: the class of image i (-1: none). guidance: GenerationRequest::guidance for the
// images with a class. Returns [N, C, H, W] uint8. `progress(done)` is called after each engine
// step that finished images.
absl::StatusOr<at::Tensor> SampleImages(const PixelModel& model, const std::vector<int64_t>& labels,
                                        uint64_t seed, const SamplingParams& sampling = {},
                                        const std::function<void(int64_t)>& progress = nullptr,
                                        double guidance = 1.0,
                                        Precision precision = Precision::kFp32);

// The samples of a class-conditional draw where image i has class i % classes (SampleImages with
// those labels), one row per class: each row holds that class's first `per_class` images, and a
// cell without an image (fewer than per_class * classes images) stays gray. Returns an HWC grid
// (ImageGrid). images: [N, C, H, W] uint8; classes, per_class >= 1.
at::Tensor ClassRowsGrid(const at::Tensor& images, int64_t classes, int64_t per_class);

struct ClassifierOutputs {
  at::Tensor features;       // [N, D] float32
  at::Tensor probabilities;  // [N, classes] float32
};
// images: [N, C, H, W] uint8 on the CPU, evaluated in batches of `batch` on the model's device.
absl::StatusOr<ClassifierOutputs> Classify(const ViT& classifier, const at::Tensor& images,
                                           int64_t batch = 256);

// a: [N, D], b: [M, D] with N, M >= 2. InvalidArgument on mismatched shapes.
absl::StatusOr<double> FrechetDistance(const at::Tensor& a, const at::Tensor& b);

}  // namespace krause
