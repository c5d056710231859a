#include "model/eval/sample_quality.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <exception>
#include <map>

#include "absl/strings/str_cat.h"
#include "model/data/png.h"
#include "model/engine/decode_engine.h"

namespace krause {

absl::StatusOr<at::Tensor> SampleImages(const PixelModel& model, const std::vector<int64_t>& labels,
                                        uint64_t seed, const SamplingParams& sampling,
                                        const std::function<void(int64_t)>& progress,
                                        double guidance, Precision precision) {
  const PixelModelConfig& c = model.config();
  const int64_t count = static_cast<int64_t>(labels.size()), n = c.seq_len();
  if (count == 0) return at::empty({0, c.channels, c.height, c.width_px}, at::kByte);
  EngineOptions eo;
  eo.max_sequences = std::min<int64_t>(count * GenerationRequest::SlotsFor(guidance), 64);
  eo.precision = precision;
  auto engine = DecodeEngine::Create(&model, eo);
  if (!engine.ok()) return engine.status();
  at::Tensor x = at::zeros({count, n}, at::kByte);
  std::map<int64_t, int64_t> image_of;  // engine id -> image index
  for (int64_t i = 0; i < count; ++i) {
    GenerationRequest r;
    r.sampling = sampling;
    r.sampling.seed = seed + static_cast<uint64_t>(i);
    r.label = labels[i];
    if (r.label >= 0) r.guidance = guidance;
    auto id = (*engine)->Submit(std::move(r));
    if (!id.ok())
      return absl::Status(id.status().code(),
                          absl::StrCat("image ", i, ": ", id.status().message()));
    image_of[*id] = i;
  }
  absl::Status failure;
  int64_t done = 0;
  while ((*engine)->Busy()) {
    const StepOutput out = (*engine)->Step();
    for (const StepOutput::Finished& f : out.finished) {
      ++done;
      if (!f.status.ok()) {
        if (failure.ok()) failure = f.status;
      } else if (static_cast<int64_t>(f.image.size()) != n) {
        failure = absl::InternalError("the engine returned an image of the wrong size");
      } else {
        std::copy(f.image.begin(), f.image.end(), x[image_of.at(f.id)].data_ptr<uint8_t>());
      }
    }
    if (progress && !out.finished.empty()) progress(done);
  }
  if (!failure.ok()) return failure;
  return x.view({count, c.height, c.width_px, c.channels}).permute({0, 3, 1, 2}).contiguous();
}

at::Tensor ClassRowsGrid(const at::Tensor& images, int64_t classes, int64_t per_class) {
  const int64_t n = images.size(0);
  at::Tensor cells = at::full({classes * per_class, images.size(1), images.size(2), images.size(3)},
                              128, at::kByte);
  for (int64_t c = 0; c < classes; ++c) {
    for (int64_t j = 0; j < per_class && j * classes + c < n; ++j) {
      cells[c * per_class + j].copy_(images[j * classes + c]);
    }
  }
  return ImageGrid(cells, per_class);
}

absl::StatusOr<ClassifierOutputs> Classify(const ViT& classifier, const at::Tensor& images,
                                           int64_t batch) {
  const ViTConfig& c = classifier.config();
  if (!images.defined() || images.dim() != 4 || images.scalar_type() != at::kByte ||
      images.size(1) != c.channels || images.size(2) != c.image_size ||
      images.size(3) != c.image_size) {
    return absl::InvalidArgumentError(absl::StrCat("images must be uint8 [N, ", c.channels, ", ",
                                                   c.image_size, ", ", c.image_size, "]"));
  }
  ClassifierOutputs out;
  try {
    at::NoGradGuard no_grad;
    const at::Device dev = classifier.parameters().Get("head.weight").device();
    std::vector<at::Tensor> feats, probs;
    for (int64_t s = 0; s < images.size(0); s += batch) {
      const int64_t b = std::min(batch, images.size(0) - s);
      const at::Tensor x = NormalizePixels(c, images.narrow(0, s, b).to(dev));
      const at::Tensor f = classifier.Features(x);
      feats.push_back(f.to(at::kCPU, at::kFloat));
      probs.push_back(at::softmax(classifier.Forward(x), -1).to(at::kCPU, at::kFloat));
    }
    out.features = at::cat(feats, 0);
    out.probabilities = at::cat(probs, 0);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("classifier failed: ", e.what()));
  }
  return out;
}

absl::StatusOr<double> FrechetDistance(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(1) ||
      a.size(0) < 2 || b.size(0) < 2) {
    return absl::InvalidArgumentError(
        "feature sets must be [N, D] and [M, D] with the same D and N, M >= 2");
  }
  at::NoGradGuard no_grad;
  auto moments = [](const at::Tensor& x) {
    const at::Tensor xd = x.to(at::kCPU, at::kDouble);
    const at::Tensor mu = xd.mean(0);
    const at::Tensor centred = xd - mu;
    return std::make_pair(mu, at::matmul(centred.t(), centred) / (xd.size(0) - 1));
  };
  const auto [mu_a, cov_a] = moments(a);
  const auto [mu_b, cov_b] = moments(b);
  // tr((S_a S_b)^(1/2)) = tr((S_a^(1/2) S_b S_a^(1/2))^(1/2)): symmetric, so eigh applies.
  auto sqrt_psd = [](const at::Tensor& s) {
    const auto [w, v] = at::linalg_eigh(s);
    return at::matmul(v * w.clamp_min(0).sqrt().unsqueeze(0), v.t());
  };
  const at::Tensor ra = sqrt_psd(cov_a);
  const at::Tensor m = at::matmul(at::matmul(ra, cov_b), ra);
  const at::Tensor eig = std::get<0>(at::linalg_eigh((m + m.t()) / 2));
  const double tr_sqrt = eig.clamp_min(0).sqrt().sum().item<double>();
  const double mean_term = (mu_a - mu_b).pow(2).sum().item<double>();
  return mean_term + cov_a.trace().item<double>() + cov_b.trace().item<double>() - 2 * tr_sqrt;
}

}  // namespace krause
