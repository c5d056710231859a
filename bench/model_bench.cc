// krause-model-bench: a bundled model's own speed, without the server: the baseline the serving
// benchmark (bench/serving_bench.py) compares the served figures with, measured in the same run.
//
//   krause-model-bench classify models/krause_vit_fmnist.safetensors --batches 1,32 [--seconds 3]
//   krause-model-bench generate models/karm_fmnist.safetensors --streams 1,64 [--images 64]
//   krause-model-bench score models/karm_fmnist.safetensors --batches 1,16 [--seconds 3]
//
// classify: what the classify batcher runs on the CPU for a batch of B Fashion-MNIST test images
//   (the packed forward, vit_cpu.h: uint8 pixels in, probabilities out), timed until --seconds
//   have passed (at least 5 runs); reports the median seconds per batch and images/s.
//   --reference times the LibTorch forward instead (NormalizePixels -> ViT::Forward -> softmax).
// score: ScoreBitsPerDim (what a generator's worker runs for a Score chunk) over B test images.
// generate: the decode engine (DecodeEngine, as the server's generator worker drives it) making
//   --images images with S sequences in flight; reports images/s.
// prefill: a completion's prefill of P positions (--lengths, default 28,392,783: one row, half
//   the image, all but one subpixel of the bundled 28x28 models) both ways side by side, the
//   runs alternating: the packed prefill the engine runs on the CPU (CpuDecoder::Prefill, bit
//   for bit the decode steps) and the LibTorch forward it replaced; reports each median and
//   packed / libtorch.
// --precision fp32,bf16 (classify, score, generate): each measurement once per precision
//   (precision.h); records name the precision that ran (fp32 after a fallback) and its linear
//   kernels. score in fp32 is the LibTorch forward, in bf16 the packed step (CpuDecoder).
// --weights float32,bfloat16: each measurement once per dtype of the linear layers' weights
//   (LoadModel's linear_dtype, the manifest's "weights_dtype"), side by side in one run; every
//   record names its "weights" and the "cpu_kernels" variant (KRAUSE_CPU_KERNELS forces one).
// init NAME OUT: writes a model of the paper's size with random weights (seeded, the official
//   layout; speed does not depend on the values) as a checkpoint: vit-s16 (Krause ViT-S/16 for
//   224x224x3 images: width 384, depth 12, heads 6, MLP 1536, 1000 classes, radius 2, top-k 8),
//   vit-s16-softmax (its softmax baseline), karm-mnist (the paper's MNIST KARM: 28x28x1, width
//   256, depth 12, heads 8, W 128, top-k 96) and arm-mnist (its softmax baseline).
//   bench/paper_models.sh writes all four into a flat --models_dir.
// classify and score take Fashion-MNIST test images when the model's shape is 28x28x1, else
//   random pixels (seeded) of the model's shape.
// Threads: SetCpuThreads(--threads) as the server does. Output: one JSON record per line.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "model/attention/cpu_kernels.h"
#include "model/data/datasets.h"
#include "model/engine/decode_engine.h"
#include "model/loader.h"
#include "model/util/threads.h"
#include "model/vit_cpu.h"

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int Usage() {
  std::fprintf(stderr,
               "usage: krause-model-bench classify CHECKPOINT [--batches 1,32] [--seconds 3]\n"
               "       [--reference 1 (the LibTorch forward)]\n"
               "       krause-model-bench generate CHECKPOINT [--streams 1,64] [--images N]\n"
               "       krause-model-bench score CHECKPOINT [--batches 1,16] [--seconds 3]\n"
               "       krause-model-bench prefill CHECKPOINT [--lengths 28,392,783] [--seconds 3]\n"
               "       krause-model-bench init vit-s16|vit-s16-softmax|karm-mnist|arm-mnist OUT\n"
               "       [--threads T (0: one per core)] [--weights float32,bfloat16]\n"
               "       [--precision fp32,bf16 (classify, score, generate)]\n"
               "       [--kv_cache float32|bfloat16 (generate: a KARM's rings)]\n");
  return 2;
}

std::vector<int64_t> Ints(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(p, &v) || v < 1) return {};
    out.push_back(v);
  }
  return out;
}

struct Args {
  std::string what, path;
  std::vector<int64_t> sizes;
  double seconds = 3;
  int64_t images = 0;
  bool reference = false;
  krause::Precision precision = krause::Precision::kFp32;
  at::ScalarType cache = at::kFloat;  // generate: the KARM's ring cache
};

// One dtype of the linear weights: its name (as records show it) and LoadModel's linear_dtype.
struct Weights {
  std::string name;
  at::ScalarType dtype;
};

int Bench(const Args& a, const Weights& weights, const krause::CpuThreads& t);

// The paper-size models of `init`, by name: a ViT or a pixel model config.
int Init(const std::string& name, const std::string& out) {
  absl::Status st;
  if (name == "vit-s16" || name == "vit-s16-softmax") {
    krause::ViTConfig c;
    c.attention =
        name == "vit-s16" ? krause::AttentionKind::kKrause : krause::AttentionKind::kSoftmax;
    c.image_size = 224;
    c.channels = 3;
    c.patch = 16;
    c.d_model = 384;
    c.depth = 12;
    c.heads = 6;
    c.mlp = 1536;
    c.classes = 1000;
    c.radius = 2;
    c.top_k = 8;
    c.mean = {0.485, 0.456, 0.406};  // ImageNet's normalisation
    c.std = {0.229, 0.224, 0.225};
    auto m = krause::ViT::Create(c, 1);
    st = m.ok() ? krause::SaveModel(out, *m) : m.status();
  } else if (name == "karm-mnist" || name == "arm-mnist") {
    krause::PixelModelConfig c;
    c.attention =
        name == "karm-mnist" ? krause::AttentionKind::kKrause : krause::AttentionKind::kSoftmax;
    c.d_model = 256;
    c.depth = 12;
    c.heads = 8;
    c.window = 128;
    c.top_k = 96;
    auto m = krause::PixelModel::Create(c, 1);
    st = m.ok() ? krause::SaveModel(out, *m) : m.status();
  } else {
    std::fprintf(stderr,
                 "krause-model-bench init: NAME is vit-s16, vit-s16-softmax, karm-mnist "
                 "or arm-mnist, got %s\n",
                 name.c_str());
    return 2;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "krause-model-bench init: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

// B images of the model's shape [B, C, H, W] uint8: Fashion-MNIST test images for 28x28x1
// models, random pixels (seeded) otherwise.
absl::StatusOr<at::Tensor> Images(int64_t b, int64_t channels, int64_t height, int64_t width) {
  if (channels == 1 && height == 28 && width == 28) {
    auto ds = krause::LoadFashionMnist("/usr/share/datasets/fashion-mnist", false);
    if (!ds.ok()) return ds.status();
    return ds->images.narrow(0, 0, b).contiguous();
  }
  at::manual_seed(b);
  return at::randint(0, 256, {b, channels, height, width}, at::kByte);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string what = argv[1], path = argv[2];
  if (what == "init") return argc == 4 ? Init(path, argv[3]) : Usage();
  std::vector<int64_t> sizes = what == "classify"  ? std::vector<int64_t>{1, 32}
                               : what == "score"   ? std::vector<int64_t>{1, 16}
                               : what == "prefill" ? std::vector<int64_t>{28, 392, 783}
                                                   : std::vector<int64_t>{1, 64};
  double seconds = 3;
  int64_t images = 0;
  int threads = 0;
  bool reference = false;
  std::vector<Weights> weights = {{"float32", at::kFloat}};
  std::vector<krause::Precision> precisions = {krause::Precision::kFp32};
  at::ScalarType cache = at::kFloat;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--batches" || flag == "--streams" || flag == "--lengths") {
      sizes = Ints(value);
      if (sizes.empty()) return Usage();
    } else if (flag == "--seconds") {
      if (!absl::SimpleAtod(value, &seconds)) return Usage();
    } else if (flag == "--images") {
      if (!absl::SimpleAtoi(value, &images)) return Usage();
    } else if (flag == "--reference") {
      reference = value == "1";
    } else if (flag == "--threads") {
      if (!absl::SimpleAtoi(value, &threads)) return Usage();
    } else if (flag == "--precision") {
      precisions.clear();
      for (absl::string_view p : absl::StrSplit(value, ',')) {
        const auto precision = krause::ParsePrecision(std::string(p), "--precision");
        if (!precision.ok()) return Usage();
        precisions.push_back(*precision);
      }
    } else if (flag == "--kv_cache") {
      if (value == "float32") {
        cache = at::kFloat;
      } else if (value == "bfloat16") {
        cache = at::kBFloat16;
      } else {
        return Usage();
      }
    } else if (flag == "--weights") {
      weights.clear();
      for (absl::string_view w : absl::StrSplit(value, ',')) {
        const auto dtype = krause::ParseLinearDtype(std::string(w), "--weights");
        if (!dtype.ok()) return Usage();
        weights.push_back({std::string(w), *dtype});
      }
    } else {
      return Usage();
    }
  }
  if ((argc - 3) % 2 != 0 ||
      (what != "classify" && what != "generate" && what != "score" && what != "prefill"))
    return Usage();
  if (const char* e = krause::cpu::CpuKernelsChoiceError(); *e != '\0') {
    std::fprintf(stderr, "krause-model-bench: %s\n", e);
    return 2;
  }
  const krause::CpuThreads t = krause::SetCpuThreads(threads);
  for (const krause::Precision p : precisions) {
    const Args args{what, path, sizes, seconds, images, reference, p, cache};
    for (const Weights& w : weights) {
      if (const int rc = Bench(args, w, t); rc != 0) return rc;
    }
  }
  return 0;
}

namespace {

// A JSON record's precision fields: the precision that ran and what computed the linear layers.
std::string PrecisionFields(krause::Precision precision, const std::string& linear_kernels) {
  return absl::StrFormat(",\"precision\":\"%s\",\"linear_kernels\":\"%s\"",
                         krause::PrecisionName(precision), linear_kernels);
}

// One JSON record's tail: the weights' dtype, the CPU kernels' variant and the threads.
std::string Tail(const Weights& weights, const krause::CpuThreads& t) {
  return absl::StrFormat(",\"weights\":\"%s\",\"cpu_kernels\":\"%s\",\"threads\":%d}", weights.name,
                         krause::cpu::CpuKernels().name, t.intra_op);
}

int Bench(const Args& a, const Weights& weights, const krause::CpuThreads& t) {
  const std::string& what = a.what;
  const std::vector<int64_t>& sizes = a.sizes;
  const double seconds = a.seconds;
  const int64_t images = a.images;
  const bool reference = a.reference;
  auto model = krause::LoadModel(a.path, "cpu", weights.dtype);
  if (!model.ok()) {
    std::fprintf(stderr, "krause-model-bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const c10::InferenceMode inference;
  if (what == "prefill") {
    if (model->classifier()) return Usage();
    const krause::PixelModel& arm = *model->pixel;
    const krause::PixelDecodeWeights packed = krause::PackForDecode(arm);
    auto cache = krause::PixelKvCache::Create(arm.config(), 1);
    if (!cache.ok()) return 1;
    if (arm.config().conditional()) cache->SetClass(0, 0);
    for (int64_t p : sizes) {
      if (p > arm.config().seq_len()) return Usage();
      at::Tensor u = at::randint(0, 256, {p}, at::kLong);
      if (arm.config().start_token) u[0].fill_(krause::PixelModel::kStartToken);
      std::vector<double> times[2];  // packed, libtorch
      const Clock::time_point start = Clock::now();
      for (int run = 0; times[1].size() < 5 || Since(start) < seconds; ++run) {
        for (int k : {run % 2, 1 - run % 2}) {  // the order alternates
          const Clock::time_point t0 = Clock::now();
          arm.Prefill(u, 0, &*cache, krause::KrauseImpl::kAuto, k == 0 ? &packed : nullptr);
          if (run > 0) times[k].push_back(Since(t0));  // run 0: warm-up
        }
      }
      double median[2];
      for (int k : {0, 1}) {
        std::sort(times[k].begin(), times[k].end());
        median[k] = times[k][times[k].size() / 2];
      }
      std::printf(
          "{\"what\":\"prefill\",\"positions\":%lld,\"runs\":%zu,\"packed_seconds\":%.6g,"
          "\"libtorch_seconds\":%.6g,\"packed_over_libtorch\":%.4g%s\n",
          static_cast<long long>(p), times[0].size(), median[0], median[1], median[0] / median[1],
          Tail(weights, t).c_str());
      std::fflush(stdout);
    }
    return 0;
  }
  if (what == "classify" || what == "score") {
    if (model->classifier() != (what == "classify")) return Usage();
    std::unique_ptr<krause::CpuViT> packed;
    std::unique_ptr<krause::CpuDecoder> decoder;
    std::vector<float> probs;
    for (int64_t b : sizes) {
      auto images = model->classifier()
                        ? Images(b, model->vit->config().channels, model->vit->config().image_size,
                                 model->vit->config().image_size)
                        : Images(b, model->pixel->config().channels, model->pixel->config().height,
                                 model->pixel->config().width_px);
      if (!images.ok()) {
        std::fprintf(stderr, "krause-model-bench: %s\n", images.status().ToString().c_str());
        return 1;
      }
      const at::Tensor pixels = *images;
      std::function<void()> run;
      if (what == "classify" && reference) {
        const krause::ViT& vit = *model->vit;
        run = [&] { at::softmax(vit.Forward(krause::NormalizePixels(vit.config(), pixels)), -1); };
      } else if (what == "classify") {
        if (!packed) {
          auto p = krause::CpuViT::Create(*model->vit, a.precision);
          if (!p.ok()) {
            std::fprintf(stderr, "krause-model-bench: %s\n", p.status().ToString().c_str());
            return 1;
          }
          packed = std::move(*p);
        }
        probs.assign(static_cast<size_t>(b * packed->classes()), 0.0f);
        run = [&] {
          if (!packed->Forward(pixels.data_ptr<uint8_t>(), b, probs.data()).ok()) std::abort();
        };
      } else {
        // fp32: the LibTorch forward; bf16: the packed step's GEMMs (what a generator worker
        // runs for a Score chunk in each precision).
        if (a.precision == krause::Precision::kBf16 && !decoder) {
          auto d = krause::CpuDecoder::Create(*model->pixel, {}, a.precision);
          if (!d.ok()) {
            std::fprintf(stderr, "krause-model-bench: %s\n", d.status().ToString().c_str());
            return 1;
          }
          decoder = std::move(*d);
        }
        const at::Tensor raster = pixels.permute({0, 2, 3, 1}).reshape({b, -1}).contiguous();
        run = [&model, raster, d = decoder.get()] {
          if (!krause::ScoreBitsPerDim(*model->pixel, raster, {}, krause::KrauseImpl::kAuto, d)
                   .ok())
            std::abort();
        };
      }
      run();  // warm-up
      std::vector<double> times;
      const Clock::time_point start = Clock::now();
      while (times.size() < 5 || Since(start) < seconds) {
        const Clock::time_point t0 = Clock::now();
        run();
        times.push_back(Since(t0));
      }
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      const std::string precision =
          packed    ? PrecisionFields(packed->precision(), packed->linear_kernels())
          : decoder ? PrecisionFields(decoder->precision(), decoder->linear_kernels())
                    : std::string();
      std::printf(
          "{\"what\":\"%s\",\"impl\":\"%s\",\"batch\":%lld,\"runs\":%zu,"
          "\"median_seconds\":%.6g,\"images_per_second\":%.6g%s%s\n",
          what.c_str(),
          what == "score" ? (decoder ? "packed" : "libtorch")
          : reference     ? "libtorch"
                          : "packed",
          static_cast<long long>(b), times.size(), median, b / median, precision.c_str(),
          Tail(weights, t).c_str());
      std::fflush(stdout);
    }
    return 0;
  }
  if (model->classifier()) return Usage();
  const krause::PixelModel& arm = *model->pixel;
  for (int64_t s : sizes) {
    const int64_t n = std::max(images, s);
    krause::EngineOptions eo;
    eo.max_sequences = s;
    eo.precision = a.precision;
    eo.cache_dtype = a.cache;
    auto engine = krause::DecodeEngine::Create(&arm, eo);
    if (!engine.ok()) {
      std::fprintf(stderr, "krause-model-bench: %s\n", engine.status().ToString().c_str());
      return 1;
    }
    for (int64_t i = 0; i < n; ++i) {
      krause::GenerationRequest r;
      r.sampling.seed = static_cast<uint64_t>(i);
      if (!(*engine)->Submit(std::move(r)).ok()) return 1;
    }
    const Clock::time_point t0 = Clock::now();
    const int64_t finished = static_cast<int64_t>(krause::RunUntilIdle(engine->get()).size());
    const double sec = Since(t0);
    std::printf(
        "{\"what\":\"generate\",\"streams\":%lld,\"images\":%lld,\"seconds\":%.6g,"
        "\"images_per_second\":%.6g%s,\"kv_cache\":\"%s\"%s\n",
        static_cast<long long>(s), static_cast<long long>(finished), sec, finished / sec,
        PrecisionFields((*engine)->precision(), (*engine)->cpu_decoder()
                                                    ? (*engine)->cpu_decoder()->linear_kernels()
                                                    : std::string())
            .c_str(),
        a.cache == at::kFloat ? "float32" : "bfloat16", Tail(weights, t).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
