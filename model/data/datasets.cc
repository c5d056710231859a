#include "model/data/datasets.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "model/util/status_macros.h"

namespace krause {

const char* const kFashionMnistLabels[10] = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                             "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                             "Bag",         "Ankle boot"};
const char* const kCifar10Labels[10] = {"airplane", "automobile", "bird",  "cat",  "deer",
                                        "dog",      "frog",       "horse", "ship", "truck"};

absl::StatusOr<at::Tensor> ReadIdx(const std::string& path) {
  ASSIGN_OR_RETURN(const IdxArray a, ReadIdxArray(path));
  at::Tensor t = at::empty(a.dims, at::kByte);
  std::memcpy(t.data_ptr(), a.data.data(), a.data.size());
  return t;
}

absl::StatusOr<ImageDataset> ReadMnistIdx(const std::string& images_path,
                                          const std::string& labels_path) {
  ASSIGN_OR_RETURN(at::Tensor images, ReadIdx(images_path));
  ASSIGN_OR_RETURN(at::Tensor labels, ReadIdx(labels_path));
  if (images.dim() != 3) {
    return absl::DataLossError(
        absl::StrCat(images_path, ": images must be N x H x W, got ", images.dim(), " dims"));
  }
  if (labels.dim() != 1 || labels.size(0) != images.size(0)) {
    return absl::DataLossError(
        absl::StrCat(labels_path, ": ", labels.numel(), " labels for ", images.size(0), " images"));
  }
  ImageDataset d;
  d.images = images.unsqueeze(1);
  d.labels = labels.to(at::kLong);
  return d;
}

namespace {

absl::StatusOr<ImageDataset> LoadMnistStyle(const std::string& dir, bool train) {
  return ReadMnistIdx(MnistStyleFile(dir, train, "images-idx3"),
                      MnistStyleFile(dir, train, "labels-idx1"));
}

}  // namespace

absl::StatusOr<ImageDataset> LoadFashionMnist(const std::string& dir, bool train) {
  ASSIGN_OR_RETURN(ImageDataset d, LoadMnistStyle(dir, train));
  d.label_names.assign(kFashionMnistLabels, kFashionMnistLabels + 10);
  return d;
}

absl::StatusOr<ImageDataset> LoadMnist(const std::string& dir, bool train) {
  ASSIGN_OR_RETURN(ImageDataset d, LoadMnistStyle(dir, train));
  for (int i = 0; i < 10; ++i) d.label_names.push_back(std::to_string(i));
  return d;
}

absl::StatusOr<ImageDataset> ReadCifar10(const std::vector<std::string>& batch_files) {
  constexpr int64_t kRecord = 1 + 3 * 32 * 32;
  std::vector<at::Tensor> images, labels;
  for (const std::string& path : batch_files) {
    ASSIGN_OR_RETURN(const std::string bytes, ReadMaybeGzip(path));
    if (bytes.empty() || bytes.size() % kRecord != 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": ", bytes.size(), " bytes is not a whole number of CIFAR-10 records of ", kRecord,
          " bytes (truncated?)"));
    }
    const int64_t n = static_cast<int64_t>(bytes.size()) / kRecord;
    at::Tensor raw = at::empty({n, kRecord}, at::kByte);
    std::memcpy(raw.data_ptr(), bytes.data(), bytes.size());
    const at::Tensor lab = raw.select(1, 0).to(at::kLong);
    if (lab.max().item<int64_t>() > 9) {
      return absl::DataLossError(absl::StrCat(path, ": label above 9: not a CIFAR-10 batch"));
    }
    labels.push_back(lab);
    images.push_back(raw.narrow(1, 1, kRecord - 1).reshape({n, 3, 32, 32}));
  }
  if (images.empty()) return absl::InvalidArgumentError("no CIFAR-10 batch files given");
  ImageDataset d;
  d.images = at::cat(images).contiguous();
  d.labels = at::cat(labels);
  d.label_names.assign(kCifar10Labels, kCifar10Labels + 10);
  return d;
}

absl::StatusOr<ImageDataset> LoadCifar10(const std::string& dir, bool train) {
  std::vector<std::string> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) files.push_back(absl::StrCat(dir, "/data_batch_", i, ".bin"));
  } else {
    files.push_back(dir + "/test_batch.bin");
  }
  return ReadCifar10(files);
}

absl::StatusOr<ImageDataset> LoadDataset(const std::string& name, const std::string& dir,
                                         bool train) {
  if (name == "fashion-mnist") {
    return LoadFashionMnist(dir.empty() ? kFashionMnistDir : dir, train);
  }
  if (name == "mnist") {
    if (dir.empty()) return absl::InvalidArgumentError("--data mnist needs --data_dir");
    return LoadMnist(dir, train);
  }
  if (name == "cifar10") {
    if (dir.empty())
      return absl::InvalidArgumentError("--data cifar10 needs --data_dir (cifar-10-batches-bin)");
    return LoadCifar10(dir, train);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--data must be fashion-mnist, mnist or cifar10, got ", name));
}

}  // namespace krause
