// Data readers (IDX raw and gzip, CIFAR-10 batches) and PNG I/O, on small files the test writes,
// including truncated and corrupt ones; plus the real Fashion-MNIST from its Debian package.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "model/data/datasets.h"
#include "model/data/png.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

std::string Idx(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((d >> (8 * i)) & 0xff));
  }
  s.append(data.begin(), data.end());
  return s;
}

std::string Write(const std::string& name, const std::string& bytes, bool gzip = false) {
  const std::string path = ::testing::TempDir() + "/" + name;
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  return path;
}

TEST(Idx, ReadsRawAndGzipImagesAndLabels) {
  std::vector<uint8_t> pixels(2 * 3 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  for (bool gz : {false, true}) {
    const std::string img = Write(gz ? "img.gz" : "img", Idx({2, 3, 4}, pixels), gz);
    const std::string lab = Write(gz ? "lab.gz" : "lab", Idx({2}, {3, 9}), gz);
    KRAUSE_ASSERT_OK_AND_ASSIGN(ImageDataset d, ReadMnistIdx(img, lab));
    EXPECT_EQ(d.images.sizes(), (std::vector<int64_t>{2, 1, 3, 4}));
    EXPECT_EQ(d.images[1][0][2][3].item<int>(), (23 * 7) % 256);
    EXPECT_EQ(d.labels[1].item<int64_t>(), 9);
  }
}

// The LibTorch-free reader the clients use (model/data/idx.h): dimensions and row-major bytes;
// MnistStyleFile prefers the .gz file when both exist.
TEST(Idx, TheArrayReaderAndTheSplitFileNames) {
  std::vector<uint8_t> pixels(2 * 3 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(200 + i);
  KRAUSE_ASSERT_OK_AND_ASSIGN(IdxArray a,
                              ReadIdxArray(Write("arr.gz", Idx({2, 3, 4}, pixels), true)));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
  ASSERT_EQ(a.data.size(), 24u);
  EXPECT_EQ(static_cast<uint8_t>(a.data[23]), 223);
  const std::string dir = ::testing::TempDir() + "/split";
  std::filesystem::remove_all(dir);  // fresh: a .gz from an earlier run would win
  std::filesystem::create_directories(dir);
  Write("split/t10k-labels-idx1-ubyte", Idx({1}, {1}));
  EXPECT_EQ(MnistStyleFile(dir, false, "labels-idx1"), dir + "/t10k-labels-idx1-ubyte");
  Write("split/t10k-labels-idx1-ubyte.gz", Idx({1}, {1}), true);
  EXPECT_EQ(MnistStyleFile(dir, false, "labels-idx1"), dir + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(MnistStyleFile(dir, true, "images-idx3"), dir + "/train-images-idx3-ubyte");
}

TEST(Idx, TruncatedOrCorruptFilesGiveClearErrors) {
  const std::string full = Idx({2, 3, 4}, std::vector<uint8_t>(24, 1));
  EXPECT_THAT(ReadIdx(Write("trunc", full.substr(0, full.size() - 3))).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated?")));
  EXPECT_THAT(ReadIdx(Write("hdr", full.substr(0, 9))).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated IDX header")));
  EXPECT_THAT(ReadIdx(Write("magic", "PK\x03\x04garbage")).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad magic")));
  // A gzip stream cut in the middle.
  const std::string gz_path = Write("cut.gz", std::string(5000, 'x') + full, true);
  std::string gz;
  {
    std::ifstream f(gz_path, std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(f), {});
  }
  EXPECT_THAT(ReadIdx(Write("cut2.gz", gz.substr(0, gz.size() / 2))).status(),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  EXPECT_THAT(ReadIdx("/nonexistent/idx").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
  const std::string img = Write("img3", Idx({2, 3, 4}, std::vector<uint8_t>(24, 1)));
  EXPECT_THAT(ReadMnistIdx(img, Write("lab3", Idx({3}, {1, 2, 3}))).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("3 labels for 2 images")));
}

TEST(Cifar10, ReadsPlanarRecordsAndRejectsPartialOnes) {
  std::string batch;
  for (int r = 0; r < 3; ++r) {
    batch.push_back(static_cast<char>(r + 4));
    for (int i = 0; i < 3072; ++i) batch.push_back(static_cast<char>((i / 1024) * 100 + r));
  }
  KRAUSE_ASSERT_OK_AND_ASSIGN(ImageDataset d, ReadCifar10({Write("b1.bin", batch)}));
  EXPECT_EQ(d.images.sizes(), (std::vector<int64_t>{3, 3, 32, 32}));
  EXPECT_EQ(d.labels[2].item<int64_t>(), 6);
  EXPECT_EQ(d.images[1][2][5][5].item<int>(), 201);  // blue plane of record 1
  EXPECT_EQ(d.label_names[6], "frog");
  EXPECT_THAT(ReadCifar10({Write("b2.bin", batch.substr(0, 5000))}).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a whole number")));
}

TEST(Png, GrayAndRgbRoundTripAndCorruptData) {
  for (int c : {1, 3}) {
    const at::Tensor img = at::randint(0, 256, {5, 7, c}, at::kByte);
    KRAUSE_ASSERT_OK_AND_ASSIGN(std::string bytes, EncodePng(img));
    KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor back, DecodePng(bytes));
    EXPECT_TRUE(at::equal(back, img));
    KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor other, DecodePng(bytes, c == 1 ? 3 : 1));
    EXPECT_EQ(other.size(2), c == 1 ? 3 : 1);
    EXPECT_THAT(DecodePng(bytes.substr(0, bytes.size() / 2)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("PNG")));
  }
  EXPECT_THAT(DecodePng("not a png").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a valid PNG")));
  EXPECT_THAT(EncodePng(at::zeros({4, 4, 2}, at::kByte)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[H, W, 1 or 3]")));
}

// The alpha channel alone: a file's alpha as is (gray and alpha, RGBA), 255 for a file without;
// and the header alone.
TEST(Png, AlphaIsDecodedAlone) {
  std::string ga, rgba;
  for (int i = 0; i < 6; ++i) {
    ga += {static_cast<char>(10 * i), static_cast<char>(i < 3 ? 255 : 40 * (i - 3))};
    rgba += {static_cast<char>(i), 'x', 'y', static_cast<char>(i < 3 ? 255 : 0)};
  }
  for (const auto& [pixels, channels] : {std::pair{ga, 2}, std::pair{rgba, 4}}) {
    KRAUSE_ASSERT_OK_AND_ASSIGN(std::string bytes, EncodePngPixels(pixels, 2, 3, channels));
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelBuffer alpha, DecodePngAlpha(bytes));
    EXPECT_EQ(alpha.height, 2);
    EXPECT_EQ(alpha.width, 3);
    EXPECT_EQ(alpha.channels, 1);
    std::string want;
    for (int i = 0; i < 6; ++i) want += pixels[static_cast<size_t>(i * channels + channels - 1)];
    EXPECT_EQ(alpha.pixels, want) << channels;
    KRAUSE_ASSERT_OK_AND_ASSIGN(PngInfo info, ReadPngInfo(bytes));  // the header alone
    EXPECT_EQ(info.height, 2);
    EXPECT_EQ(info.width, 3);
    EXPECT_EQ(info.channels, channels == 2 ? 1 : 3);
  }
  KRAUSE_ASSERT_OK_AND_ASSIGN(std::string opaque, EncodePng(at::zeros({2, 3, 1}, at::kByte)));
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelBuffer alpha, DecodePngAlpha(opaque));
  EXPECT_EQ(alpha.pixels, std::string(6, '\xff'));
  EXPECT_THAT(ReadPngInfo("not a png").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a valid PNG")));
  EXPECT_THAT(DecodePngAlpha("not a png").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a valid PNG")));
  EXPECT_THAT(EncodePngPixels("ab", 1, 1, 5).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(1 to 4)")));
}

// The header is checked before anything is decoded: a caller's check sees the header's size and
// the channels it would get, and its refusal (or the absolute limit) comes back as is.
TEST(Png, TheHeaderIsCheckedBeforeDecoding) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(std::string bytes, EncodePng(at::zeros({5, 7, 3}, at::kByte)));
  PngInfo seen;
  KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor gray, DecodePng(bytes, 1, [&](const PngInfo& info) {
                                seen = info;
                                return absl::OkStatus();
                              }));
  EXPECT_EQ(seen.height, 5);
  EXPECT_EQ(seen.width, 7);
  EXPECT_EQ(seen.channels, 1);
  EXPECT_EQ(gray.size(2), 1);
  EXPECT_THAT(DecodePng(bytes, 0,
                        [](const PngInfo& info) {
                          return absl::InvalidArgumentError(absl::StrCat("no ", info.channels));
                        })
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no 3"));
  // A header claiming 100000 x 100000 (IHDR rewritten, CRC fixed) is refused by the limit.
  std::string liar = bytes;
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) liar[at + i] = static_cast<char>((v >> (24 - 8 * i)) & 0xff);
  };
  put32(16, 100000);
  put32(20, 100000);
  put32(29,
        static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(liar.data() + 12), 4 + 13)));
  EXPECT_THAT(DecodePng(liar).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("claims 100000x100000x3 = 30000000000 bytes decoded, over the "
                                 "limit of 67108864")));
}

TEST(FashionMnist, TheDebianPackageLoads) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(dir + "/t10k-labels-idx1-ubyte.gz").good()) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/install-deps.sh installs it)";
  }
  KRAUSE_ASSERT_OK_AND_ASSIGN(ImageDataset test, LoadFashionMnist(dir, false));
  EXPECT_EQ(test.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(at::bincount(test.labels).min().item<int64_t>(), 1000);  // balanced classes
  EXPECT_EQ(test.label_names[9], "Ankle boot");
}

}  // namespace
}  // namespace krause
