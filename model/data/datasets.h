// Readers for image data sets: MNIST / Fashion-MNIST IDX files (gzip or raw) and CIFAR-10 binary
// batches. Everything is read into memory as uint8 tensors; corrupt or truncated files give a
// clear DataLoss error naming the file. Thread-safety: free functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/data/idx.h"

namespace krause {

struct ImageDataset {
  at::Tensor images;  // [N, C, H, W] uint8
  at::Tensor labels;  // [N] int64
  std::vector<std::string> label_names;
  int64_t size() const { return images.defined() ? images.size(0) : 0; }
};

// An IDX file of unsigned bytes (type 0x08): a uint8 tensor with the file's dimensions.
absl::StatusOr<at::Tensor> ReadIdx(const std::string& path);

// MNIST-style image (N x H x W) and label (N) IDX files.
absl::StatusOr<ImageDataset> ReadMnistIdx(const std::string& images_path,
                                          const std::string& labels_path);

// Fashion-MNIST from a folder holding {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (as the
// Debian package dataset-fashion-mnist installs in /usr/share/datasets/fashion-mnist).
absl::StatusOr<ImageDataset> LoadFashionMnist(const std::string& dir, bool train);
// MNIST from a folder with the same file names.
absl::StatusOr<ImageDataset> LoadMnist(const std::string& dir, bool train);
// CIFAR-10 binary batches (records of 1 label byte + 3072 pixel bytes, R then G then B planes).
absl::StatusOr<ImageDataset> ReadCifar10(const std::vector<std::string>& batch_files);
// CIFAR-10 from the folder cifar-10-batches-bin: data_batch_1..5.bin or test_batch.bin.
absl::StatusOr<ImageDataset> LoadCifar10(const std::string& dir, bool train);

// A data set by name: "fashion-mnist" (dir defaults to the Debian package's folder), "mnist" or
// "cifar10" (dir required). InvalidArgument for another name or a missing dir.
absl::StatusOr<ImageDataset> LoadDataset(const std::string& name, const std::string& dir,
                                         bool train);

extern const char* const kFashionMnistLabels[10];
extern const char* const kCifar10Labels[10];

}  // namespace krause
