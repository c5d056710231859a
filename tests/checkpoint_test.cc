// safetensors read/write and strict parameter loading.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "model/checkpoint/safetensors.h"
#include "model/nn/parameters.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(Safetensors, RoundTripsDtypesShapesAndMetadata) {
  const at::Tensor a = at::randn({3, 4});
  NamedTensors in = {{"a.f32", a},
                     {"b.f16", a.to(at::kHalf)},
                     {"c.bf16", a.to(at::kBFloat16)},
                     {"d.i64", at::arange(5, at::kLong)},
                     {"e.scalar", at::full({}, 2.5f)},
                     {"f.empty", at::zeros({0, 3})}};
  KRAUSE_ASSERT_OK_AND_ASSIGN(std::string bytes,
                              SerializeSafetensors(in, {{"config", "{\"x\":1}"}}));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + header_len) % 8, 0u);  // data starts 8-byte aligned
  KRAUSE_ASSERT_OK_AND_ASSIGN(SafetensorsContents out, ParseSafetensors(bytes));
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out.tensors[i].first, in[i].first);
    EXPECT_EQ(out.tensors[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_TRUE(at::equal(out.tensors[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_EQ(out.metadata.at("config"), "{\"x\":1}");
}

TEST(Safetensors, FileRoundTrip) {
  const std::string path = ::testing::TempDir() + "/rt.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"w", at::ones({2})}}, {}).ok());
  KRAUSE_ASSERT_OK_AND_ASSIGN(SafetensorsContents c, ReadSafetensors(path));
  EXPECT_TRUE(at::equal(c.tensors.at(0).second, at::ones({2})));
  EXPECT_THAT(ReadSafetensors(path + ".missing").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
}

TEST(Safetensors, CorruptAndTruncatedFilesGiveClearErrors) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(std::string bytes,
                              SerializeSafetensors({{"w", at::ones({4, 4})}}, {}));
  EXPECT_THAT(ParseSafetensors(bytes.substr(0, 5)).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  EXPECT_THAT(ParseSafetensors(bytes.substr(0, bytes.size() - 4)).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("lies outside")));
  std::string bad_len = bytes;
  bad_len[6] = 0x7f;
  EXPECT_THAT(ParseSafetensors(bad_len).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header length")));
  std::string bad_json = bytes;
  bad_json[8] = '[';
  EXPECT_THAT(ParseSafetensors(bad_json).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a JSON object")));
  const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}";
  std::string wrong_size(8, '\0');
  wrong_size[0] = static_cast<char>(header.size());
  wrong_size += header + std::string(8, '\0');
  EXPECT_THAT(ParseSafetensors(wrong_size).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shape x dtype needs 12")));
  const std::string h2 = "{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  std::string unknown(8, '\0');
  unknown[0] = static_cast<char>(h2.size());
  unknown += h2 + "x";
  EXPECT_THAT(
      ParseSafetensors(unknown).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unsupported safetensors dtype")));
}

TEST(ParameterStore, StrictLoadListsEveryProblemAndChangesNothing) {
  ParameterStore p;
  p.Add("a", at::zeros({2, 3}));
  p.Add("b", at::zeros({4}));
  p.Add("s", at::zeros({1}));
  const absl::Status st =
      p.LoadStrict({{"a", at::ones({3, 2})}, {"c", at::ones({1})}, {"s", at::ones({})}});
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr("missing: b"), HasSubstr("unexpected: c"),
                                 HasSubstr("mis-shaped: a (checkpoint [3, 2], model [2, 3])"))));
  EXPECT_TRUE(at::equal(p.Get("a"), at::zeros({2, 3})));
  // Derived buffers can be ignored; fp16 converts; a 0-d scalar loads into [1].
  ASSERT_TRUE(p.LoadStrict({{"a", at::ones({2, 3}).to(at::kHalf)},
                            {"b", at::ones({4})},
                            {"s", at::full({}, 3.0f)},
                            {"buf", at::ones({9})}},
                           {"buf"})
                  .ok());
  EXPECT_TRUE(at::equal(p.Get("a"), at::ones({2, 3})));
  EXPECT_FLOAT_EQ(p.Get("s").item<float>(), 3.0f);
  EXPECT_TRUE(p.Get("a").requires_grad());
}

}  // namespace
}  // namespace krause
