// The training loop behind krause-train: any of the four models (krause_vit, vit, karm, arm) on
// Fashion-MNIST, MNIST or CIFAR-10, on CPU or CUDA. AdamW, warmup then cosine, gradient clipping,
// label smoothing (classifiers), random crop + flip augmentation, fixed seeds; evaluates test
// accuracy or bits/dim every epoch; checkpoints every epoch and resumes; shows a progress bar
// with ETA on stderr; writes curve.png, summary.json, model.safetensors (+ samples.png for
// generators) into the output folder.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "model/pixel_model.h"
#include "model/vit.h"

namespace krause {

struct TrainOptions {
  std::string model = "krause_vit";    // krause_vit | vit | karm | arm
  std::string data = "fashion-mnist";  // fashion-mnist | mnist | cifar10
  std::string data_dir;                // default: the Debian package's folder for fashion-mnist
  std::string out_dir = "train-out";
  int64_t epochs = 10, batch = 128;
  double lr = 1e-3, weight_decay = 0.05, clip = 1.0, label_smoothing = 0.1;
  double warmup_fraction = 0.05;
  uint64_t seed = 0;
  int threads = 0;  // 0: all cores
  std::string device = "cpu";
  bool resume = false;
  int64_t train_limit = 0, test_limit = 0;  // 0: the whole split
  bool augment = true;                      // classifiers only
  int64_t crop_pad = 2;
  bool flip = true;
  bool save_fp16 = true;
  // Generators: images sampled into samples.png at the end (0: none); conditional generators
  // sample this many per class, one row per class.
  int64_t samples = 16;
  // Generators: condition on the data set's classes (a class embedding; PixelModelConfig::classes),
  // with the label dropped to "no class" for this share of the training sequences, so that the
  // model also samples and scores unconditionally.
  bool conditional = false;
  double label_drop = 0.1;
  std::string command;   // the command line, recorded in summary.json
  ViTConfig vit;         // sizes for krause_vit / vit (attention is set from `model`)
  PixelModelConfig pixel;  // sizes for karm / arm
  bool quiet = false;    // no progress bar
};

absl::Status Train(const TrainOptions& options);

}  // namespace krause
