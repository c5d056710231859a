// End-to-end tests of krause-server's Inspect (in process, on loopback ports; server_test.h): the
// reply is the model-level inspection of the same model and image, and every bad request is
// refused naming the field.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <string>
#include <vector>

#include "model/engine/inspect.h"
#include "server_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

// ---------------------------------------------------------------------------------------------
// Inspect: the reply is the model-level inspection (model/engine/inspect.h, tested against the
// reference operator in inspect_test) of the same model and image, field by field.

void ExpectReplyIs(const v1::InspectResponse& r, const Inspection& want) {
  EXPECT_EQ(r.attention(), want.krause ? v1::ModelInfo::KRAUSE : v1::ModelInfo::SOFTMAX);
  EXPECT_EQ(r.tokens(), static_cast<uint32_t>(want.tokens));
  ASSERT_EQ(r.queries_size(), static_cast<int>(want.queries.size()));
  ASSERT_EQ(r.token_rows_size(), static_cast<int>(want.positions.size()));
  for (size_t t = 0; t < want.positions.size(); ++t) {
    EXPECT_EQ(r.token_rows(t), want.positions[t].first);
    EXPECT_EQ(r.token_columns(t), want.positions[t].second);
  }
  ASSERT_EQ(r.layers_size(), static_cast<int>(want.layers.size()));
  for (size_t l = 0; l < want.layers.size(); ++l) {
    const LayerAttention& wl = want.layers[l];
    EXPECT_EQ(r.layers(l).layer(), static_cast<uint32_t>(wl.layer));
    EXPECT_EQ(r.layers(l).keys_per_query(), static_cast<uint32_t>(wl.k));
    ASSERT_EQ(r.layers(l).heads_size(), static_cast<int>(wl.heads.size()));
    for (size_t h = 0; h < wl.heads.size(); ++h) {
      const v1::HeadAttention& rh = r.layers(l).heads(h);
      EXPECT_FLOAT_EQ(rh.sigma(), static_cast<float>(wl.heads[h].sigma));
      EXPECT_NEAR(rh.sink_share(), wl.heads[h].sink_share, 1e-6);
      EXPECT_NEAR(rh.mean_distance(), wl.heads[h].mean_distance, 1e-6);
      EXPECT_NEAR(rh.effective_neighbours(), wl.heads[h].effective_neighbours, 1e-5);
      EXPECT_EQ(rh.busiest_key(), static_cast<uint32_t>(wl.heads[h].busiest_key));
      EXPECT_NEAR(rh.busiest_key_share(), wl.heads[h].busiest_key_share, 1e-6);
      ASSERT_EQ(rh.queries_size(), static_cast<int>(wl.heads[h].queries.size()));
      for (size_t q = 0; q < wl.heads[h].queries.size(); ++q) {
        const QueryAttention& wq = wl.heads[h].queries[q];
        const v1::QueryAttention& rq = rh.queries(q);
        EXPECT_EQ(rq.query(), static_cast<uint32_t>(wq.query));
        ASSERT_EQ(rq.keys_size(), static_cast<int>(wq.keys.size()));
        for (size_t j = 0; j < wq.keys.size(); ++j) {
          EXPECT_EQ(rq.keys(j), static_cast<uint32_t>(wq.keys[j])) << "query " << wq.query;
          EXPECT_NEAR(rq.weights(j), wq.weights[j], 1e-6);
        }
        EXPECT_NEAR(rq.outside(), wq.outside, 1e-6);
      }
    }
  }
}

TEST_F(ServerTest, InspectGivesTheModelsAttention) {
  const c10::InferenceMode inference;
  // The Krause ViT (the default classifier): 2x2 patches + CLS, every layer and query.
  const at::Tensor image = RandomImages(1, 8, 8, 1, 6)[0];
  {
    v1::InspectRequest req;
    *req.mutable_image() = RawImage(image);
    grpc::ClientContext ctx;
    v1::InspectResponse r;
    ASSERT_TRUE(stub_->Inspect(&ctx, req, &r).ok());
    EXPECT_EQ(r.model(), "vit");
    EXPECT_EQ(r.model_version(), "1");
    EXPECT_EQ(r.implementation(), "fused_cpu");
    EXPECT_EQ(r.grid_height(), 2u);
    EXPECT_EQ(r.grid_width(), 2u);
    auto m = LoadModel(models_.dir + "/vit.safetensors");
    ASSERT_TRUE(m.ok());
    KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection want,
                                InspectClassifier(*m->vit, image.permute({2, 0, 1}), {}));
    ExpectReplyIs(r, want);
  }
  // The conditional KARM, given a class by name, chosen queries; the ARM with its own k.
  const at::Tensor pixels = RandomImages(1, 6, 6, 1, 7)[0];
  for (const std::string model : {"karm-cond", "arm"}) {
    v1::InspectRequest req;
    req.set_model(model);
    *req.mutable_image() = RawImage(pixels);
    InspectOptions o;
    o.queries = {35, 0, 20};
    for (int64_t q : o.queries) req.add_queries(static_cast<uint32_t>(q));
    int64_t cls = -1;
    if (model == "arm") {
      req.set_top_k(5);
      o.top_k = 5;
    } else {
      req.set_label("two");
      cls = 2;
    }
    grpc::ClientContext ctx;
    v1::InspectResponse r;
    const grpc::Status st = stub_->Inspect(&ctx, req, &r);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(r.grid_height(), 6u);
    auto m = LoadModel(models_.dir + "/" + (model == "arm" ? "arm" : "cond") + ".safetensors");
    ASSERT_TRUE(m.ok());
    KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection want,
                                InspectGenerator(*m->pixel, pixels.reshape({-1}), cls, o));
    ExpectReplyIs(r, want);
  }
}

TEST_F(ServerTest, InspectValidationNamesTheField) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.inspect_max_entries = 100;
  StartServer(o);
  const v1::Image vit_image = RawImage(RandomImages(1, 8, 8, 1, 1)[0]);
  const v1::Image karm_image = RawImage(RandomImages(1, 6, 6, 1, 1)[0]);
  struct Case {
    std::function<void(v1::InspectRequest*)> edit;
    std::string field, text;
  };
  const std::vector<Case> cases = {
      {[&](v1::InspectRequest* r) { r->add_layers(1); }, "layers[0]",
       "layers[0] = 1 is out of range: the model's layers are 0 .. 0"},
      {[&](v1::InspectRequest* r) { r->add_queries(2), r->add_queries(5); }, "queries[1]",
       "queries[1] = 5 is out of range: the model's tokens are 0 .. 4"},
      {[&](v1::InspectRequest* r) { r->set_top_k(2); }, "top_k", "top_k is for softmax models"},
      {[&](v1::InspectRequest* r) { r->set_class_index(1); }, "class_index",
       "is a classifier; a class is for conditional generators"},
      {[&](v1::InspectRequest* r) {
         r->set_model("karm");  // 36 queries x 2 heads x 4 keys = 288 > 100
         *r->mutable_image() = karm_image;
       },
       "queries", "the reply would list 288 keys"},
      {[&](v1::InspectRequest* r) {
         r->set_model("karm");
         *r->mutable_image() = karm_image;
         r->set_label("one");
       },
       "label", "label: model karm"},
      {[&](v1::InspectRequest* r) {
         r->set_model("karm-cond");
         *r->mutable_image() = karm_image;
         r->add_queries(1);
         r->set_label("four");
       },
       "label", "label: model karm-cond"},
      {[&](v1::InspectRequest* r) { *r->mutable_image() = karm_image; }, "image",
       "but model vit takes 8x8x1"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::InspectRequest req;
    *req.mutable_image() = vit_image;
    cases[i].edit(&req);
    grpc::ClientContext ctx;
    v1::InspectResponse r;
    const grpc::Status st = stub_->Inspect(&ctx, req, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << i;
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr(cases[i].text)) << i;
    const server::ErrorDetails d = server::DetailsOf(st);
    ASSERT_EQ(d.fields.size(), 1u) << i;
    EXPECT_EQ(d.fields[0].first, cases[i].field) << i << ": " << st.error_message();
  }
  // Within the limit the same model answers; an unknown model is NOT_FOUND.
  v1::InspectRequest ok;
  ok.set_model("karm");
  *ok.mutable_image() = karm_image;
  ok.add_queries(35);
  grpc::ClientContext ctx;
  v1::InspectResponse r;
  EXPECT_TRUE(stub_->Inspect(&ctx, ok, &r).ok());
  EXPECT_EQ(r.layers(0).heads(0).queries(0).keys_size(), 4);
  ok.set_model("nope");
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->Inspect(&ctx2, ok, &r).error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace krause::testing
