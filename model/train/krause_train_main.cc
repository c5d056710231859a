// krause-train: trains Krause ViT / ViT / KARM / ARM. See --help.
#include <ATen/Parallel.h>

#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "model/train/trainer.h"
#include "model/util/help.h"

ABSL_FLAG(std::string, model, "krause_vit", "krause_vit | vit | karm | arm");
ABSL_FLAG(std::string, data, "fashion-mnist", "fashion-mnist | mnist | cifar10");
ABSL_FLAG(std::string, data_dir, "",
          "folder with the data set files (default for fashion-mnist: the Debian package's "
          "/usr/share/datasets/fashion-mnist)");
ABSL_FLAG(std::string, out, "train-out", "output folder: checkpoints, model, summary, PNGs");
ABSL_FLAG(int64_t, epochs, 10, "epochs");
ABSL_FLAG(int64_t, batch, 128, "batch size");
ABSL_FLAG(double, lr, 1e-3, "peak learning rate (AdamW)");
ABSL_FLAG(double, weight_decay, 0.05, "decoupled weight decay (matrices only)");
ABSL_FLAG(double, clip, 1.0, "gradient clipping: maximum global L2 norm (0: off)");
ABSL_FLAG(double, label_smoothing, 0.1, "label smoothing (classifiers)");
ABSL_FLAG(double, warmup, 0.05, "warmup as a fraction of all steps, then cosine decay");
ABSL_FLAG(uint64_t, seed, 0, "seed for initialisation, shuffling, augmentation and sampling");
ABSL_FLAG(int, threads, 0, "intra-op threads (0: all cores)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(bool, resume, false, "continue from the output folder's last checkpoint");
ABSL_FLAG(int64_t, train_limit, 0, "use only the first N training images (0: all)");
ABSL_FLAG(int64_t, test_limit, 0, "use only the first N test images (0: all)");
ABSL_FLAG(bool, augment, true, "random crop and horizontal flip (classifiers)");
ABSL_FLAG(int64_t, crop_pad, 2, "random crop padding in pixels");
ABSL_FLAG(bool, flip, true, "random horizontal flips when augmenting");
ABSL_FLAG(bool, fp16, true, "store model.safetensors in fp16 (evaluated as stored)");
ABSL_FLAG(int64_t, samples, 16,
          "generators: images to sample into samples.png (0: none); conditional generators: "
          "per class, one row per class");
ABSL_FLAG(bool, conditional, false,
          "generators: condition on the data set's classes (class embedding added to every "
          "position); the model also samples without a class");
ABSL_FLAG(bool, class_norm, false,
          "conditional generators: the class also scales and shifts every LayerNorm's output "
          "(adaptive LayerNorm; the config's \"class_norm\")");
ABSL_FLAG(double, label_drop, 0.1,
          "conditional generators: share of training sequences whose label is dropped to \"no "
          "class\"");
ABSL_FLAG(bool, quiet, false, "no progress output");
// model sizes
ABSL_FLAG(int64_t, width, 64, "model width d_model (the checkpoint config's \"width\")");
ABSL_FLAG(int64_t, depth, 4, "layers");
ABSL_FLAG(int64_t, heads, 4, "attention heads");
ABSL_FLAG(int64_t, mlp, 128, "ViT MLP width (generators use 4 D)");
ABSL_FLAG(int64_t, patch, 4, "ViT patch size");
ABSL_FLAG(int64_t, radius, 1, "Krause ViT grid radius");
ABSL_FLAG(std::string, metric, "manhattan", "Krause ViT grid metric: manhattan | chebyshev");
ABSL_FLAG(
    int64_t, top_k, 0,
    "top-k (ViT: first layer, doubling over depth; KARM: every layer); 0: 2 (ViT) or W/2 (KARM)");
ABSL_FLAG(int64_t, window, 64, "KARM causal window W");
ABSL_FLAG(double, sigma_init, 2.5, "initial sigma (log_sigma = ln sigma)");
ABSL_FLAG(bool, start_token, true,
          "generators: learned start token, so that every subpixel is scored");

int main(int argc, char** argv) {
  krause::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "trains a Krause ViT, ViT, KARM or ARM.\n"
      "  krause-train --model krause_vit --epochs 10 --out out/kvit\n"
      "Writes OUT/model.safetensors (config in its metadata), OUT/summary.json, OUT/curve.png\n"
      "(training loss per step, left; test accuracy or bits/dim per epoch, right) and, for\n"
      "generators, OUT/samples.png. OUT/checkpoint.safetensors and OUT/optimizer.safetensors\n"
      "are written every epoch; --resume continues from them.");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "unexpected argument %s (see --help)\n", rest[1]);
    return 2;
  }
  krause::TrainOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.data = absl::GetFlag(FLAGS_data);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.out_dir = absl::GetFlag(FLAGS_out);
  o.epochs = absl::GetFlag(FLAGS_epochs);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.clip = absl::GetFlag(FLAGS_clip);
  o.label_smoothing = absl::GetFlag(FLAGS_label_smoothing);
  o.warmup_fraction = absl::GetFlag(FLAGS_warmup);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.threads <= 0) o.threads = static_cast<int>(std::thread::hardware_concurrency());
  o.device = absl::GetFlag(FLAGS_device);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.train_limit = absl::GetFlag(FLAGS_train_limit);
  o.test_limit = absl::GetFlag(FLAGS_test_limit);
  o.augment = absl::GetFlag(FLAGS_augment);
  o.crop_pad = absl::GetFlag(FLAGS_crop_pad);
  o.flip = absl::GetFlag(FLAGS_flip);
  o.save_fp16 = absl::GetFlag(FLAGS_fp16);
  o.samples = absl::GetFlag(FLAGS_samples);
  o.conditional = absl::GetFlag(FLAGS_conditional);
  o.label_drop = absl::GetFlag(FLAGS_label_drop);
  if (o.label_drop < 0 || o.label_drop > 1) {
    std::fprintf(stderr, "--label_drop must be in [0, 1]\n");
    return 2;
  }
  o.quiet = absl::GetFlag(FLAGS_quiet);
  o.command = absl::StrJoin(argv, argv + argc, " ");

  o.vit.d_model = o.pixel.d_model = absl::GetFlag(FLAGS_width);
  o.vit.depth = o.pixel.depth = absl::GetFlag(FLAGS_depth);
  o.vit.heads = o.pixel.heads = absl::GetFlag(FLAGS_heads);
  o.vit.mlp = absl::GetFlag(FLAGS_mlp);
  o.vit.patch = absl::GetFlag(FLAGS_patch);
  o.vit.radius = absl::GetFlag(FLAGS_radius);
  const std::string metric = absl::GetFlag(FLAGS_metric);
  if (metric != "manhattan" && metric != "chebyshev") {
    std::fprintf(stderr, "--metric must be manhattan or chebyshev\n");
    return 2;
  }
  o.vit.metric =
      metric == "manhattan" ? krause::GridMetric::kManhattan : krause::GridMetric::kChebyshev;
  o.pixel.window = absl::GetFlag(FLAGS_window);
  const int64_t k = absl::GetFlag(FLAGS_top_k);
  o.vit.top_k = k > 0 ? k : 2;
  o.pixel.top_k = k > 0 ? k : std::max<int64_t>(1, o.pixel.window / 2);
  o.vit.sigma_init = o.pixel.sigma_init = absl::GetFlag(FLAGS_sigma_init);
  o.pixel.start_token = absl::GetFlag(FLAGS_start_token);
  o.pixel.class_norm = absl::GetFlag(FLAGS_class_norm);
  if (o.pixel.class_norm && !o.conditional) {
    std::fprintf(stderr, "--class_norm needs --conditional\n");
    return 2;
  }

  const absl::Status st = krause::Train(o);
  if (!st.ok()) {
    std::fprintf(stderr, "\nkrause-train: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
