#include "model/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/checkpoint/safetensors.h"
#include "model/data/datasets.h"
#include "model/data/png.h"
#include "model/engine/decode_engine.h"
#include "model/eval/sample_quality.h"
#include "model/train/optimizer.h"
#include "model/train/plot.h"
#include "model/util/status_macros.h"
#include "model/util/threads.h"

namespace krause {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string Hms(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const int64_t t = static_cast<int64_t>(s);
  return t >= 3600 ? absl::StrFormat("%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60)
                   : absl::StrFormat("%02d:%02d", t / 60, t % 60);
}

absl::StatusOr<ImageDataset> LoadData(const TrainOptions& o, bool train) {
  return LoadDataset(o.data, o.data_dir, train);
}

ImageDataset Limit(ImageDataset d, int64_t limit) {
  if (limit > 0 && limit < d.size()) {
    d.images = d.images.narrow(0, 0, limit);
    d.labels = d.labels.narrow(0, 0, limit);
  }
  return d;
}

// The model being trained: a classifier or a generator behind one small interface.
struct Trainee {
  std::optional<ViT> vit;
  std::optional<PixelModel> pixel;
  bool classifier() const { return vit.has_value(); }
  ParameterStore& params() { return vit ? vit->parameters() : pixel->parameters(); }
  std::string config_json() const {
    return vit ? vit->config().ToJson() : pixel->config().ToJson();
  }
  AttentionCost flops() const { return vit ? vit->FlopsPerImage() : pixel->FlopsPerImage(); }
};

at::Tensor Normalise(const ViTConfig& c, const at::Tensor& pixels, const at::Device& dev) {
  return NormalizePixels(c, pixels.to(dev));
}

// [B, C, H, W] uint8 -> [B, H*W*C] int64, raster order row, column, channel
at::Tensor RasterTokens(const at::Tensor& pixels, const at::Device& dev) {
  return pixels.permute({0, 2, 3, 1}).reshape({pixels.size(0), -1}).to(dev, at::kLong);
}

// Random crop (zero padding `pad`) and horizontal flip, per image, from `gen`.
at::Tensor Augment(const at::Tensor& pixels, int64_t pad, bool flip, at::Generator& gen) {
  const int64_t b = pixels.size(0), h = pixels.size(2), w = pixels.size(3);
  at::Tensor padded = at::constant_pad_nd(pixels, {pad, pad, pad, pad}, 0);
  at::Tensor out = at::empty_like(pixels);
  const at::Tensor offs = at::randint(0, 2 * pad + 1, {b, 2}, gen, at::kLong);
  const at::Tensor flips = at::randint(0, 2, {b}, gen, at::kLong);
  auto oa = offs.accessor<int64_t, 2>();
  auto fa = flips.accessor<int64_t, 1>();
  for (int64_t i = 0; i < b; ++i) {
    at::Tensor crop = padded[i].narrow(1, oa[i][0], h).narrow(2, oa[i][1], w);
    if (flip && fa[i]) crop = crop.flip({2});
    out[i].copy_(crop);
  }
  return out;
}

// Classifier: cross-entropy with label smoothing. logits [B, K], labels [B].
at::Tensor SmoothedCrossEntropy(const at::Tensor& logits, const at::Tensor& labels, double eps) {
  const at::Tensor logp = at::log_softmax(logits, -1);
  const at::Tensor nll = -logp.gather(1, labels.unsqueeze(1)).squeeze(1);
  return ((1.0 - eps) * nll - eps * logp.mean(-1)).mean();
}

struct EvalResult {
  double metric = 0;  // accuracy (classifier) or bits/dim (generator; conditional ones: given
                      // each image's class)
  double loss = 0;    // mean NLL in nats
  double unconditional_bits = 0;  // conditional generators: bits/dim without the classes
};

// A conditional generator's class rows for a batch of labels (undefined for an unconditional
// one): with `drop` > 0, each label becomes the null class with that probability.
at::Tensor ClassRows(const PixelModel& model, const at::Tensor& labels, double drop,
                     at::Generator* gen) {
  if (!model.config().conditional()) return {};
  at::Tensor rows = labels.to(at::kLong);
  if (drop > 0) {
    const at::Tensor dropped = at::rand({rows.size(0)}, *gen) < drop;
    rows = at::where(dropped, at::full_like(rows, model.config().null_class()), rows);
  }
  return rows;
}

EvalResult Evaluate(Trainee& m, const ImageDataset& test, int64_t batch, const at::Device& dev) {
  at::NoGradGuard no_grad;
  double correct = 0, nll = 0, nll_unconditional = 0;
  const int64_t n = test.size();
  for (int64_t s = 0; s < n; s += batch) {
    const int64_t b = std::min(batch, n - s);
    const at::Tensor px = test.images.narrow(0, s, b);
    if (m.classifier()) {
      const at::Tensor logits = m.vit->Forward(Normalise(m.vit->config(), px, dev));
      const at::Tensor labels = test.labels.narrow(0, s, b).to(dev);
      correct += (logits.argmax(1) == labels).sum().item<double>();
      nll +=
          at::nll_loss(at::log_softmax(logits, -1), labels, {}, at::Reduction::Sum).item<double>();
    } else {
      const at::Tensor tokens = RasterTokens(px, dev);
      const at::Tensor rows = ClassRows(*m.pixel, test.labels.narrow(0, s, b), 0, nullptr);
      nll += m.pixel->NllPerImage(tokens, KrauseImpl::kAuto, rows).sum().item<double>();
      if (rows.defined()) nll_unconditional += m.pixel->NllPerImage(tokens).sum().item<double>();
    }
  }
  EvalResult r;
  r.loss = nll / n;
  r.metric = m.classifier() ? correct / n : r.loss / std::log(2.0);
  r.unconditional_bits = nll_unconditional / n / std::log(2.0);
  return r;
}

// Plain autoregressive sampling with full recomputation: slow but obviously right; the decoding
// engine is the fast path. Returns [count, C, H, W] uint8.
// On the CPU through the generation engine (KV caches, one batched decode step per subpixel;
// image i from seed + i); elsewhere by re-running the forward over the prefix per subpixel.
// A conditional generator draws class i % classes for image i.
at::Tensor SampleForCard(const PixelModel& model, int64_t count, uint64_t seed,
                         const at::Device& dev) {
  at::NoGradGuard no_grad;
  const PixelModelConfig& c = model.config();
  const int64_t n = c.seq_len();
  auto label_of = [&c](int64_t i) { return c.conditional() ? i % c.classes : int64_t{-1}; };
  if (dev.is_cpu()) {
    std::vector<int64_t> labels(count);
    for (int64_t i = 0; i < count; ++i) labels[i] = label_of(i);
    auto imgs = SampleImages(model, labels, seed);
    if (imgs.ok()) return *imgs;
  }
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor x = at::zeros({count, n}, at::kLong);
  at::Tensor classes;
  if (c.conditional()) classes = at::arange(count, at::kLong).remainder(c.classes).to(dev);
  const int64_t first = c.start_token ? 0 : 1;  // without a start token x_0 is fixed to 0
  for (int64_t t = first; t < n; ++t) {
    // With a start token t pixels give t + 1 positions, without one t positions: either way the
    // last position predicts x_t.
    const at::Tensor logits = model.Forward(x.narrow(1, 0, t).to(dev), KrauseImpl::kAuto, classes)
                                  .select(1, -1)
                                  .to(at::kCPU);
    x.select(1, t).copy_(at::multinomial(at::softmax(logits, -1), 1, false, gen).squeeze(1));
  }
  return x.view({count, c.height, c.width_px, c.channels}).permute({0, 3, 1, 2}).to(at::kByte);
}

absl::Status WriteCurve(const std::string& path, const std::vector<double>& step_loss,
                        const std::vector<double>& epoch_metric) {
  Series loss{{}, {}, 200, 40, 40};
  const size_t stride = std::max<size_t>(1, step_loss.size() / 400);
  for (size_t i = 0; i < step_loss.size(); i += stride) {
    double sum = 0;
    size_t k = 0;
    for (size_t j = i; j < std::min(step_loss.size(), i + stride); ++j, ++k) sum += step_loss[j];
    loss.x.push_back(static_cast<double>(i));
    loss.y.push_back(sum / k);
  }
  Series metric{{}, {}, 30, 90, 200};
  for (size_t e = 0; e < epoch_metric.size(); ++e) {
    metric.x.push_back(static_cast<double>(e + 1));
    metric.y.push_back(epoch_metric[e]);
  }
  const at::Tensor left = PlotPanel({loss}, 480, 320);
  const at::Tensor right = PlotPanel({metric}, 480, 320);
  return WritePng(path, at::cat({left, right}, 1));
}

}  // namespace

absl::Status Train(const TrainOptions& o) {
  const auto start = Clock::now();
  const CpuThreads threads = SetCpuThreads(o.threads);
  at::manual_seed(o.seed);
  const at::Device dev(o.device);
  if (dev.is_cuda() && !at::hasCUDA())
    return absl::FailedPreconditionError("--device cuda: no CUDA device");
  std::filesystem::create_directories(o.out_dir);

  ASSIGN_OR_RETURN(ImageDataset train, LoadData(o, true));
  ASSIGN_OR_RETURN(ImageDataset test, LoadData(o, false));
  train = Limit(std::move(train), o.train_limit);
  test = Limit(std::move(test), o.test_limit);
  const int64_t channels = train.images.size(1), height = train.images.size(2),
                width = train.images.size(3);

  Trainee m;
  if (o.model == "krause_vit" || o.model == "vit") {
    ViTConfig c = o.vit;
    c.attention = o.model == "vit" ? AttentionKind::kSoftmax : AttentionKind::kKrause;
    c.image_size = height;
    c.channels = channels;
    c.classes = static_cast<int64_t>(train.label_names.size());
    c.labels = train.label_names;
    // Per-channel normalisation from the training split.
    const at::Tensor f = train.images.to(at::kFloat) / 255.0;
    c.mean.clear();
    c.std.clear();
    for (int64_t ch = 0; ch < channels; ++ch) {
      c.mean.push_back(f.select(1, ch).mean().item<double>());
      c.std.push_back(f.select(1, ch).std().item<double>());
    }
    ASSIGN_OR_RETURN(ViT v, ViT::Create(c, o.seed));
    m.vit = std::move(v);
  } else if (o.model == "karm" || o.model == "arm") {
    PixelModelConfig c = o.pixel;
    c.attention = o.model == "arm" ? AttentionKind::kSoftmax : AttentionKind::kKrause;
    c.height = height;
    c.width_px = width;
    c.channels = channels;
    if (o.conditional) {
      c.classes = static_cast<int64_t>(train.label_names.size());
      c.labels = train.label_names;
    }
    ASSIGN_OR_RETURN(PixelModel a, PixelModel::Create(c, o.seed));
    m.pixel = std::move(a);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--model must be krause_vit, vit, karm or arm, got ", o.model));
  }
  m.params().To(dev);
  AdamW opt(&m.params(), AdamWOptions{o.lr, 0.9, 0.999, 1e-8, o.weight_decay});

  const int64_t steps_per_epoch = (train.size() + o.batch - 1) / o.batch;
  const int64_t total_steps = steps_per_epoch * o.epochs;
  const int64_t warmup = static_cast<int64_t>(o.warmup_fraction * total_steps);
  const std::string ckpt = o.out_dir + "/checkpoint.safetensors";
  const std::string opt_path = o.out_dir + "/optimizer.safetensors";
  nlohmann::json history = nlohmann::json::array();
  std::vector<double> step_loss, epoch_metric;
  int64_t first_epoch = 0;
  double trained_seconds = 0;

  if (o.resume && std::filesystem::exists(ckpt)) {
    ASSIGN_OR_RETURN(SafetensorsContents c, ReadSafetensors(ckpt));
    if (c.metadata["config"] != m.config_json()) {
      return absl::FailedPreconditionError(
          absl::StrCat(ckpt, " was written for another model config"));
    }
    RETURN_IF_ERROR(m.params().LoadStrict(c.tensors));
    ASSIGN_OR_RETURN(SafetensorsContents s, ReadSafetensors(opt_path));
    RETURN_IF_ERROR(opt.LoadState(s.tensors));
    history = nlohmann::json::parse(c.metadata["history"]);
    for (const auto& h : history) epoch_metric.push_back(h["test_metric"].get<double>());
    step_loss = nlohmann::json::parse(c.metadata["step_loss"]).get<std::vector<double>>();
    first_epoch = std::stoll(c.metadata["epoch"]);
    trained_seconds = std::stod(c.metadata["trained_seconds"]);
    if (!o.quiet)
      std::fprintf(stderr, "resumed from %s after epoch %lld\n", ckpt.c_str(),
                   static_cast<long long>(first_epoch));
  }

  const AttentionCost flops = m.flops();
  if (!o.quiet) {
    std::fprintf(stderr,
                 "krause-train: %s on %s (%lld train / %lld test images), %lld parameters, %.3g "
                 "GFLOPs/image executed (%.3g dense-equivalent), %d threads (BLAS calls: %d)\n",
                 o.model.c_str(), o.data.c_str(), static_cast<long long>(train.size()),
                 static_cast<long long>(test.size()),
                 static_cast<long long>(m.params().NumParameters()), flops.executed_flops / 1e9,
                 flops.dense_equivalent_flops / 1e9, threads.intra_op, threads.blas);
  }

  for (int64_t epoch = first_epoch; epoch < o.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    at::Generator gen = at::detail::createCPUGenerator(o.seed * 1000003 + epoch);
    const at::Tensor perm = at::randperm(train.size(), gen, at::kLong);
    double loss_sum = 0;
    int64_t seen = 0;
    auto last_print = Clock::now() - std::chrono::seconds(10);
    for (int64_t s = 0; s < steps_per_epoch; ++s) {
      const int64_t b = std::min(o.batch, train.size() - s * o.batch);
      const at::Tensor idx = perm.narrow(0, s * o.batch, b);
      at::Tensor px = train.images.index_select(0, idx);
      at::Tensor loss;
      if (m.classifier()) {
        if (o.augment) px = Augment(px, o.crop_pad, o.flip, gen);
        const at::Tensor logits = m.vit->Forward(Normalise(m.vit->config(), px, dev));
        loss = SmoothedCrossEntropy(logits, train.labels.index_select(0, idx).to(dev),
                                    o.label_smoothing);
      } else {
        const at::Tensor rows =
            ClassRows(*m.pixel, train.labels.index_select(0, idx), o.label_drop, &gen);
        loss = m.pixel
                   ->NllPerImage(RasterTokens(px, dev), KrauseImpl::kAuto,
                                 rows.defined() ? rows.to(dev) : rows)
                   .mean();
      }
      opt.ZeroGrad();
      loss.backward();
      ClipGradNorm(&m.params(), o.clip);
      const double lr = WarmupCosine(opt.steps(), warmup, total_steps, o.lr);
      opt.Step(lr);
      const double l = loss.item<double>();
      if (!std::isfinite(l))
        return absl::InternalError(
            absl::StrCat("loss became ", l, " at epoch ", epoch + 1, " step ", s));
      step_loss.push_back(l);
      loss_sum += l * b;
      seen += b;
      if (!o.quiet && (Seconds(last_print) > 0.5 || s + 1 == steps_per_epoch)) {
        last_print = Clock::now();
        const double el = Seconds(epoch_start);
        const double rate = seen / std::max(el, 1e-9);
        const double epoch_eta = (train.size() - seen) / rate;
        const double total_eta = epoch_eta + (o.epochs - epoch - 1) * train.size() / rate;
        const int bar = static_cast<int>(24.0 * (s + 1) / steps_per_epoch);
        std::fprintf(
            stderr,
            "\repoch %lld/%lld [%s%s] %lld/%lld loss %.4f lr %.2e %.0f img/s eta %s (all %s) ",
            static_cast<long long>(epoch + 1), static_cast<long long>(o.epochs),
            std::string(bar, '#').c_str(), std::string(24 - bar, '.').c_str(),
            static_cast<long long>(s + 1), static_cast<long long>(steps_per_epoch), loss_sum / seen,
            lr, rate, Hms(epoch_eta).c_str(), Hms(total_eta).c_str());
      }
    }
    const double train_seconds = Seconds(epoch_start);
    trained_seconds += train_seconds;
    const EvalResult ev = Evaluate(m, test, o.batch, dev);
    epoch_metric.push_back(ev.metric);
    history.push_back({{"epoch", epoch + 1},
                       {"train_loss", loss_sum / seen},
                       {"test_metric", ev.metric},
                       {"test_nll", ev.loss},
                       {"test_bits_per_dim_unconditional", ev.unconditional_bits},
                       {"train_seconds", train_seconds},
                       {"images_per_second", seen / train_seconds}});
    if (!o.quiet) {
      std::fprintf(stderr, "\nepoch %lld: train loss %.4f, test %s %.4f, %.0f s\n",
                   static_cast<long long>(epoch + 1), loss_sum / seen,
                   m.classifier() ? "accuracy" : "bits/dim", ev.metric, train_seconds);
    }
    std::map<std::string, std::string> meta = {
        {"config", m.config_json()},
        {"epoch", std::to_string(epoch + 1)},
        {"history", history.dump()},
        {"step_loss", nlohmann::json(step_loss).dump()},
        {"trained_seconds", std::to_string(trained_seconds)}};
    RETURN_IF_ERROR(WriteSafetensors(opt_path, opt.State(), {}));
    RETURN_IF_ERROR(WriteSafetensors(ckpt, m.params().items(), meta));
    RETURN_IF_ERROR(WriteCurve(o.out_dir + "/curve.png", step_loss, epoch_metric));
  }

  // The final model, stored as it will be shipped (fp16 if asked), and evaluated as stored.
  NamedTensors final_tensors;
  for (const auto& [name, t] : m.params().items()) {
    final_tensors.push_back({name, o.save_fp16 ? t.detach().to(at::kHalf) : t.detach()});
  }
  {
    at::NoGradGuard no_grad;
    RETURN_IF_ERROR(m.params().LoadStrict(final_tensors));
  }
  const EvalResult final_eval = Evaluate(m, test, o.batch, dev);
  nlohmann::json summary = {
      {"model", o.model},
      {"config", nlohmann::json::parse(m.config_json())},
      {"data", o.data},
      {"train_images", train.size()},
      {"test_images", test.size()},
      {"epochs", o.epochs},
      {"batch", o.batch},
      {"lr", o.lr},
      {"weight_decay", o.weight_decay},
      {"label_smoothing", m.classifier() ? o.label_smoothing : 0.0},
      {"seed", o.seed},
      {"command", o.command},
      {"parameters", m.params().NumParameters()},
      {"flops_per_image_executed", flops.executed_flops},
      {"flops_per_image_dense_equivalent", flops.dense_equivalent_flops},
      {"selection_comparisons_per_image", flops.selection_comparisons},
      {"storage", o.save_fp16 ? "F16" : "F32"},
      {m.classifier() ? "test_accuracy" : "test_bits_per_dim", final_eval.metric},
      {"test_nll", final_eval.loss},
      {"label_drop", o.conditional ? o.label_drop : 0.0},
      {"test_bits_per_dim_unconditional", m.pixel && m.pixel->config().conditional()
                                              ? final_eval.unconditional_bits
                                              : final_eval.metric},
      {"train_seconds", trained_seconds},
      {"wall_seconds", Seconds(start)},
      {"threads", at::get_num_threads()},
      {"blas_threads", BlasThreads()},
      {"history", history}};
  std::map<std::string, std::string> meta = {{"config", m.config_json()},
                                             {"summary", summary.dump()}};
  RETURN_IF_ERROR(WriteSafetensors(o.out_dir + "/model.safetensors", final_tensors, meta));
  std::ofstream(o.out_dir + "/summary.json") << summary.dump(2) << "\n";
  if (!m.classifier() && o.samples > 0) {
    if (!o.quiet)
      std::fprintf(stderr, "sampling %lld images...\n", static_cast<long long>(o.samples));
    const PixelModelConfig& ac = m.pixel->config();
    if (ac.conditional()) {
      // o.samples per class (image i is class i % classes), one row per class.
      const at::Tensor imgs = SampleForCard(*m.pixel, o.samples * ac.classes, o.seed + 17, dev);
      RETURN_IF_ERROR(
          WritePng(o.out_dir + "/samples.png", ClassRowsGrid(imgs, ac.classes, o.samples)));
    } else {
      const at::Tensor imgs = SampleForCard(*m.pixel, o.samples, o.seed + 17, dev);
      RETURN_IF_ERROR(
          WritePng(o.out_dir + "/samples.png",
                   ImageGrid(imgs, static_cast<int64_t>(std::ceil(std::sqrt(o.samples))))));
    }
  }
  if (!o.quiet) {
    std::fprintf(stderr,
                 "done: test %s %.4f (as stored, %s); wrote "
                 "%s/{model.safetensors,summary.json,curve.png%s}\n",
                 m.classifier() ? "accuracy" : "bits/dim", final_eval.metric,
                 o.save_fp16 ? "fp16" : "fp32", o.out_dir.c_str(),
                 m.classifier() ? "" : ",samples.png");
  }
  return absl::OkStatus();
}

}  // namespace krause
