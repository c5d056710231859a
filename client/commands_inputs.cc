// krause-client's shared helpers (client/commands.h): the error exits, the input images of
// classify, score and inspect (PNG files, or IDX files sliced with --index), the images per call,
// the class a call asks for and score's classes from --labels_file.
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "client/flags.h"
#include "model/data/idx.h"
#include "model/util/files.h"
#include "server/v1/raw_image.h"

namespace krause::client::cli {

int Fail(const std::string& what) {
  std::fprintf(stderr, "krause-client: %s\n", what.c_str());
  return 1;
}

int FailRpc(const char* rpc, const grpc::Status& st, const ConnectionOptions& o) {
  return Fail(absl::StrCat(rpc, " failed: ", krause::client::Explain(st, o)));
}

namespace {

// --index A:B (or A) of an IDX file of `size` entries: [A, B); the whole file without --index.
absl::StatusOr<std::pair<int64_t, int64_t>> IndexRange(int64_t size) {
  int64_t a = 0, b = size;
  const std::string range = absl::GetFlag(FLAGS_index);
  if (range.empty()) return std::make_pair(a, b);
  std::vector<std::string> parts = absl::StrSplit(range, ':');
  bool ok = parts.size() <= 2 && absl::SimpleAtoi(parts[0], &a);
  if (ok) b = a + 1;
  if (ok && parts.size() == 2) ok = absl::SimpleAtoi(parts[1], &b);
  if (!ok || a < 0 || b > size || a >= b)
    return absl::InvalidArgumentError(
        absl::StrCat("--index ", range, ": need A:B with 0 <= A < B <= ", size));
  return std::make_pair(a, b);
}

}  // namespace

absl::StatusOr<std::vector<InputImage>> ReadInputs(const std::vector<std::string>& files) {
  std::vector<InputImage> out;
  for (const std::string& f : files) {
    const std::string ext = std::filesystem::path(f).extension().string();
    if (ext == ".png" || ext == ".PNG") {
      auto bytes = krause::ReadFileToString(f);
      if (!bytes.ok()) return bytes.status();
      InputImage in;
      in.name = f;
      in.image.set_png(std::move(*bytes));
      out.push_back(std::move(in));
      continue;
    }
    auto t = krause::ReadIdxArray(f);
    if (!t.ok()) return t.status();
    if (t->dims.size() != 3)
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": not an IDX image file (", t->dims.size(), " dimensions, expected 3)"));
    const int64_t count = t->dims[0], h = t->dims[1], w = t->dims[2];
    if (absl::GetFlag(FLAGS_index).empty() && count > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, " holds ", count, " images: choose some with --index A:B"));
    }
    auto range = IndexRange(count);
    if (!range.ok()) return range.status();
    const auto [a, b] = *range;
    const std::string_view data = t->data;
    for (int64_t i = a; i < b; ++i) {
      InputImage in;
      in.name = absl::StrCat(f, "[", i, "]");
      in.image = krause::server::RawImageProto(h, w, 1, data.substr(i * h * w, h * w));  // gray
      out.push_back(std::move(in));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("no input files");
  return out;
}

// Images per call for `model` (empty: the server's default of `kind`): --batch, and at most the
// model's max_images_per_request.
absl::StatusOr<int> ImagesPerCall(v1::KrauseService::Stub& stub, const ConnectionOptions& o,
                                  v1::ModelInfo::Kind kind) {
  const int batch = std::max(1, absl::GetFlag(FLAGS_batch));
  grpc::ClientContext ctx;
  krause::client::PrepareContext(o, &ctx);
  v1::ListModelsResponse r;
  const grpc::Status st = stub.ListModels(&ctx, v1::ListModelsRequest(), &r);
  if (!st.ok())
    return absl::UnavailableError(absl::StrCat("list: ", krause::client::Explain(st, o)));
  const std::string want = absl::GetFlag(FLAGS_model);
  for (const auto& m : r.models()) {
    if (want.empty() ? (m.kind() == kind && m.is_default()) : m.name() == want) {
      return m.max_images_per_request() > 0
                 ? std::min<int>(batch, static_cast<int>(m.max_images_per_request()))
                 : batch;
    }
  }
  return batch;  // unknown: the call itself reports NOT_FOUND
}

absl::StatusOr<ClassChoice> ChosenClass() {
  ClassChoice c{absl::GetFlag(FLAGS_label), absl::GetFlag(FLAGS_class_index)};
  if (!c.label.empty() && c.index >= 0)
    return absl::InvalidArgumentError("give --label or --class_index, not both");
  if (c.index < -1) return absl::InvalidArgumentError("--class_index must be >= 0 (or -1: none)");
  return c;
}

// Score: each input's class (-1: none), from --labels_file (an IDX label file sliced like the
// images) or one --label / --class_index for all; empty when none is given.
absl::StatusOr<std::vector<int64_t>> ScoreIndices(size_t n) {
  const std::string file = absl::GetFlag(FLAGS_labels_file);
  if (file.empty()) return std::vector<int64_t>();
  auto t = krause::ReadIdxArray(file);
  if (!t.ok()) return t.status();
  if (t->dims.size() != 1)
    return absl::InvalidArgumentError(absl::StrCat(file, ": not an IDX label file"));
  const int64_t count = t->dims[0];
  auto range = IndexRange(count);
  if (!range.ok())
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", range.status().message()));
  const int64_t a = range->first;
  if (a + static_cast<int64_t>(n) > count) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, " has ", count, " labels; the images need ", a + n));
  }
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(t->data[a + i]);
  return out;
}

}  // namespace krause::client::cli
