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

// A safetensors file from a header (JSON text) and `data_bytes` zero bytes of data.
std::string Safetensors(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

// Hostile headers: each is refused with a message naming the problem, before any tensor is
// allocated (the sizes claimed here would need exabytes).
TEST(Safetensors, HostileHeadersAreRefusedBeforeAllocating) {
  struct Case {
    std::string header;
    size_t data;
    const char* error;
  };
  const std::vector<Case> cases = {
      // Shapes whose product wraps 2^64 to a small number, and shapes over the file.
      {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", 0,
       "has 0 bytes, but shape x dtype needs over 2^64"},
      {R"({"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,16]}})", 16,
       "has 16 bytes, but shape x dtype needs 4000000000000"},
      {R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4,
       "bad shape"},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "bad shape"},
      // Offsets past the end, reversed, or not numbers.
      {R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[100,104]}})", 4, "lies outside"},
      {R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[3,2]}})", 4, "lies outside"},
      {R"({"w":{"dtype":"U8","shape":[4],"data_offsets":["0",4]}})", 4, "bad offsets"},
      // Overlapping tensors (many could claim the same bytes), holes, bytes left over.
      {R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
       8, "overlapping tensors"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
       8, "(a hole)"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 8,
       "the tensors cover 4 of the 8 data bytes"},
      // A size that does not match shape x dtype; a bad dtype; wrong JSON types.
      {R"({"w":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", 8, "shape x dtype needs 6"},
      {R"({"w":{"dtype":"F3","shape":[1],"data_offsets":[0,4]}})", 4,
       "unsupported safetensors dtype \"F3\""},
      {R"({"w":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", 4, "needs dtype, shape"},
      {R"({"w":{"dtype":"F32","shape":{"a":1},"data_offsets":[0,4]}})", 4, "needs dtype, shape"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "needs dtype, shape"},
      {R"({"w":[1,2,3]})", 4, "needs dtype, shape"},
      {R"({"__metadata__":{"k":1}})", 0, "is not a string"},
      {R"({"__metadata__":[]})", 0, "is not an object"},
      {R"([1,2])", 0, "not a JSON object"},
      {R"({"w":)", 0, "not a JSON object"},
      {std::string(200000, '[') + std::string(200000, ']'), 0, "not a JSON object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header.substr(0, 120));
    const auto r = ParseSafetensors(Safetensors(c.header, c.data));
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.error));
  }
  // A header length far beyond the file, and beyond the 100 MiB header limit.
  std::string huge = Safetensors("{}", 0);
  huge[7] = 0x40;
  EXPECT_THAT(ParseSafetensors(huge).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not fit the file")));
  // Empty tensors (a zero dimension) are fine, at any offset the others leave.
  KRAUSE_ASSERT_OK_AND_ASSIGN(
      SafetensorsContents ok,
      ParseSafetensors(
          Safetensors(R"({"e":{"dtype":"F32","shape":[0,1000000],"data_offsets":[0,0]},)"
                      R"("w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                      2)));
  ASSERT_EQ(ok.tensors.size(), 2u);
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
