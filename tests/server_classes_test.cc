// End-to-end tests of krause-server's class-conditional generation (in process, on loopback ports;
// server_test.h): a conditional generator lists its classes and draws the one asked for, guided
// generation is seeded and costs two passes, class errors name the field and the valid labels,
// and Score given the classes is the conditional bits per dimension.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "server_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

// ---------------------------------------------------------------------------------------------
// Class-conditional generation (karm-cond: classes zero, one, two).

v1::GenerateRequest CondRequest(uint64_t seed, uint32_t n) {
  v1::GenerateRequest req;
  req.set_model("karm-cond");
  req.set_num_images(n);
  req.set_seed(seed);
  return req;
}

TEST_F(ServerTest, ConditionalGeneratorListsItsClassesAndDrawsTheAskedOne) {
  grpc::ClientContext ctx;
  v1::GetModelRequest g;
  g.set_name("karm-cond");
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModel(&ctx, g, &info).ok());
  EXPECT_EQ(info.classes(), 3u);
  EXPECT_THAT(std::vector<std::string>(info.labels().begin(), info.labels().end()),
              ::testing::ElementsAre("zero", "one", "two"));
  grpc::ClientContext c2;
  g.set_name("karm");
  ASSERT_TRUE(stub_->GetModel(&c2, g, &info).ok());
  EXPECT_EQ(info.classes(), 0u);
  EXPECT_EQ(info.labels_size(), 0);

  // By label and by index: the same images; another class or none: other images.
  v1::GenerateRequest by_label = CondRequest(11, 3);
  by_label.set_label("one");
  v1::GenerateRequest by_index = CondRequest(11, 3);
  by_index.set_class_index(1);
  v1::GenerateRequest other = CondRequest(11, 3);
  other.set_label("two");
  const Stream a = RunGenerate(*stub_, by_label), b = RunGenerate(*stub_, by_index),
               c = RunGenerate(*stub_, other), none = RunGenerate(*stub_, CondRequest(11, 3));
  for (const Stream* s : {&a, &b, &c, &none})
    ASSERT_TRUE(s->status.ok()) << s->status.error_message();
  EXPECT_EQ(PngsOf(a), PngsOf(b));
  EXPECT_EQ(RowsOf(a), PngsOf(a));
  EXPECT_NE(PngsOf(a), PngsOf(c));
  EXPECT_NE(PngsOf(a), PngsOf(none));
  // Image i of a call is image 0 of a call with its own seed: per class too.
  v1::GenerateRequest second = CondRequest(server::ImageSeed(11, 1), 1);
  second.set_label("one");
  const Stream s2 = RunGenerate(*stub_, second);
  ASSERT_TRUE(s2.status.ok());
  EXPECT_EQ(PngsOf(s2).at(0), PngsOf(a).at(1));

  // Completion given a class keeps the prompt rows.
  const at::Tensor prompt = RandomImages(1, 6, 6, 1, 3)[0];
  v1::GenerateRequest comp = CondRequest(4, 2);
  comp.set_label("zero");
  *comp.mutable_prompt() = RawImage(prompt);
  comp.set_prompt_rows(2);
  const Stream done = RunGenerate(*stub_, comp);
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  const std::string head(reinterpret_cast<const char*>(prompt.contiguous().data_ptr<uint8_t>()),
                         12);
  for (const auto& [i, px] : PngsOf(done)) EXPECT_EQ(px.substr(0, 12), head) << "image " << i;
  EXPECT_TRUE(SlotsFree("karm-cond"));
}

TEST_F(ServerTest, GuidedGenerationIsSeededAndCostsTwoPasses) {
  v1::GenerateRequest guided = CondRequest(21, 2);
  guided.set_label("two");
  guided.set_guidance(3.0f);
  v1::GenerateRequest plain = CondRequest(21, 2);
  plain.set_label("two");
  const Stream a = RunGenerate(*stub_, guided), b = RunGenerate(*stub_, guided),
               p = RunGenerate(*stub_, plain);
  for (const Stream* s : {&a, &b, &p}) ASSERT_TRUE(s->status.ok()) << s->status.error_message();
  EXPECT_EQ(PngsOf(a), PngsOf(b));
  EXPECT_EQ(RowsOf(a), PngsOf(a));
  EXPECT_NE(PngsOf(a), PngsOf(p));
  const v1::GenerateSummary& ga = a.messages.back().summary();
  const v1::GenerateSummary& pa = p.messages.back().summary();
  EXPECT_EQ(ga.pixels_generated(), pa.pixels_generated());
  EXPECT_DOUBLE_EQ(ga.flops_executed(), 2 * pa.flops_executed());
  EXPECT_DOUBLE_EQ(ga.flops_dense_equivalent(), 2 * pa.flops_dense_equivalent());
  // Guidance 1 is plain conditional sampling.
  plain.set_guidance(1.0f);
  EXPECT_EQ(PngsOf(RunGenerate(*stub_, plain)), PngsOf(p));
  EXPECT_TRUE(SlotsFree("karm-cond"));
}

TEST_F(ServerTest, ClassErrorsNameTheFieldAndTheValidLabels) {
  auto expect_invalid = [&](const v1::GenerateRequest& req, const std::vector<std::string>& parts) {
    const Stream s = RunGenerate(*stub_, req);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    for (const std::string& p : parts)
      EXPECT_THAT(s.status.error_message(), ::testing::HasSubstr(p));
  };
  v1::GenerateRequest r = CondRequest(1, 1);
  r.set_label("three");
  expect_invalid(r, {"label", "karm-cond", "valid labels: zero, one, two"});
  r.set_class_index(3);
  expect_invalid(r, {"class_index", "outside [0, 3)"});
  r.set_model("karm");
  r.set_label("zero");
  expect_invalid(r, {"label", "model karm", "unconditional"});
  r.set_class_index(0);
  expect_invalid(r, {"class_index", "unconditional"});
  // Guidance: a class is needed, and a scale in [0, 20].
  v1::GenerateRequest g = CondRequest(1, 1);
  g.set_guidance(2.0f);
  expect_invalid(g, {"guidance 2 needs a class", "karm-cond was given none"});
  g.set_model("karm");
  expect_invalid(g, {"guidance 2 needs a class", "karm is unconditional"});
  g.set_model("karm-cond");
  g.set_label("one");
  g.set_guidance(21.0f);
  expect_invalid(g, {"guidance must be in [0, 20], got 21"});
  g.set_guidance(-1.0f);
  expect_invalid(g, {"guidance must be in [0, 20], got -1"});
  EXPECT_TRUE(SlotsFree("karm-cond"));
  EXPECT_TRUE(SlotsFree("karm"));
}

TEST_F(ServerTest, ScoreGivenClassesIsTheConditionalBitsPerDim) {
  const at::Tensor images = RandomImages(3, 6, 6, 1, 8);
  auto score = [&](const std::string& model, const std::vector<std::string>& labels,
                   const std::vector<int32_t>& indices, v1::ScoreResponse* r) {
    v1::ScoreRequest req;
    req.set_model(model);
    for (int i = 0; i < 3; ++i) *req.add_images() = RawImage(images[i]);
    for (const auto& l : labels) req.add_labels(l);
    for (int32_t i : indices) req.add_class_indices(i);
    grpc::ClientContext ctx;
    return stub_->Score(&ctx, req, r);
  };
  v1::ScoreResponse by_label, by_index, none;
  ASSERT_TRUE(score("karm-cond", {"two", "", "zero"}, {}, &by_label).ok());
  ASSERT_TRUE(score("karm-cond", {}, {2, -1, 0}, &by_index).ok());
  ASSERT_TRUE(score("karm-cond", {}, {}, &none).ok());
  auto m = LoadModel(models_.dir + "/cond.safetensors");
  ASSERT_TRUE(m.ok());
  auto want = ScoreBitsPerDim(*m->pixel, images.reshape({3, -1}), {2, -1, 0});
  ASSERT_TRUE(want.ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(by_label.bits_per_dim(i), (*want)[i]);
    EXPECT_DOUBLE_EQ(by_index.bits_per_dim(i), (*want)[i]);
  }
  EXPECT_DOUBLE_EQ(none.bits_per_dim(1), (*want)[1]);  // "" / -1: without a class
  EXPECT_NE(none.bits_per_dim(0), (*want)[0]);

  v1::ScoreResponse r;
  grpc::Status st = score("karm-cond", {"one"}, {}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("labels has 1 entries for 3 images"));
  st = score("karm-cond", {"one", "one", "four"}, {}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(),
              ::testing::HasSubstr("labels[2]: model karm-cond: class \"four\""));
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("valid labels: zero, one, two"));
  st = score("karm-cond", {"one", "one", "one"}, {0, 0, 0}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("at most one of the two"));
  st = score("karm-cond", {}, {0, 3, -2}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("class_indices[1]"));
  st = score("karm", {"zero", "zero", "zero"}, {}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("unconditional"));
}

}  // namespace
}  // namespace krause::testing
