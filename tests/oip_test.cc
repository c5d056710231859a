// The Open Inference Protocol's conversions, case by case, without a server: REST JSON
// (ParseInferJson and the response), the gRPC messages (raw and typed contents), raw BYTES
// tensors, numeric parameters, and the gRPC code -> HTTP status mapping. The server end to end
// is tests/oip_e2e_test.py.
#include "server/oip/oip.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "server/edge/http_call.h"
#include "server/edge/status.h"
#include "server/oip/oip_json.h"
#include "server/oip/oip_proto.h"

namespace krause::server::oip {
namespace {

std::string Message(const absl::Status& st) { return std::string(st.message()); }

TEST(OipJson, NestedAndFlatDataGiveTheSameRawBytes) {
  auto nested =
      ParseInferJson(R"({"id":"a","inputs":[{"name":"image","datatype":"UINT8","shape":[1,2,2,1],)"
                     R"("data":[[[[1],[2]],[[3],[255]]]]}]})",
                     "m", "1");
  auto flat = ParseInferJson(
      R"({"inputs":[{"name":"image","datatype":"UINT8","shape":[1,2,2,1],"data":[1,2,3,255]}]})",
      "m", "");
  ASSERT_TRUE(nested.ok()) << nested.status();
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(nested->model, "m");
  EXPECT_EQ(nested->version, "1");
  EXPECT_EQ(nested->id, "a");
  EXPECT_EQ(nested->inputs[0].data, std::string("\x01\x02\x03\xff", 4));
  EXPECT_EQ(flat->inputs[0].data, nested->inputs[0].data);
}

TEST(OipJson, TypesAndParameters) {
  auto r = ParseInferJson(
      R"({"parameters":{"seed":18446744073709551615,"n":-3,"g":2.5,"b":true,"s":"x"},)"
      R"("inputs":[{"name":"c","datatype":"INT32","shape":[2],"data":[-1,7]},)"
      R"({"name":"t","datatype":"BYTES","shape":[2],"data":["ab",""]},)"
      R"({"name":"f","datatype":"FP64","shape":[1],"data":[0.5]}],)"
      R"("outputs":[{"name":"images"}]})",
      "m", "");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(std::get<uint64_t>(r->parameters.at("seed")), 18446744073709551615ull);
  EXPECT_EQ(std::get<int64_t>(r->parameters.at("n")), -3);
  EXPECT_EQ(std::get<double>(r->parameters.at("g")), 2.5);
  EXPECT_EQ(std::get<bool>(r->parameters.at("b")), true);
  EXPECT_EQ(std::get<std::string>(r->parameters.at("s")), "x");
  int32_t c[2];
  std::memcpy(c, r->inputs[0].data.data(), 8);
  EXPECT_EQ(c[0], -1);
  EXPECT_EQ(c[1], 7);
  const auto elements = BytesElements(r->inputs[1]);
  ASSERT_EQ(elements.size(), 2u);
  EXPECT_EQ(elements[0], "ab");
  EXPECT_EQ(elements[1], "");
  ASSERT_EQ(r->outputs.size(), 1u);
  EXPECT_EQ(r->outputs[0].name, "images");
}

TEST(OipJson, EachBadBodyNamesWhatIsWrong) {
  const struct {
    const char* body;
    const char* says;
  } cases[] = {
      {"{", "not valid JSON"},
      {"[]", "must be a JSON object"},
      {R"({"inputs":[],"extra":1})", "unknown field \"extra\""},
      {R"({"inputs":{}})", "inputs: must be an array"},
      {R"({"id":3,"inputs":[]})", "id: must be a string"},
      {R"({"inputs":[{"datatype":"UINT8","shape":[1],"data":[1]}]})", "needs a string \"name\""},
      {R"({"inputs":[{"name":"x","datatype":"U8","shape":[1],"data":[1]}]})", "unknown datatype"},
      {R"({"inputs":[{"name":"x","datatype":"UINT8","shape":[-1],"data":[1]}]})", "negative"},
      {R"({"inputs":[{"name":"x","datatype":"UINT8","shape":[2],"data":[1]}]})",
       "data has 1 elements but shape [2] needs 2"},
      {R"({"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[256]}]})",
       "does not fit UINT8"},
      {R"({"inputs":[{"name":"x","datatype":"INT8","shape":[1],"data":[-129]}]})",
       "does not fit INT8"},
      {R"({"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[1.5]}]})",
       "is a JSON number, not a UINT8"},
      {R"({"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":[1]}]})", "not a BYTES"},
      {R"({"inputs":[{"name":"x","datatype":"FP16","shape":[1],"data":[1]}]})",
       "FP16 cannot be sent as JSON"},
      {R"({"parameters":{"p":[1]},"inputs":[]})", "parameters.p: a parameter must be"},
      {R"({"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[1],"parameters":)"
       R"({"binary_data_size":1}}]})",
       "has both \"data\" and binary_data_size"},
      {R"({"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"parameters":)"
       R"({"binary_data_size":1}}]})",
       "binary_data_size needs the Inference-Header-Content-Length header"},
      {R"({"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[1],"parameters":)"
       R"({"shm":1}}]})",
       "unknown parameter \"shm\""},
      {R"({"inputs":[],"outputs":[{"nam":"x"}]})", "outputs[0]: must be an object"},
  };
  for (const auto& c : cases) {
    auto r = ParseInferJson(c.body, "m", "");
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(Message(r.status()).find(c.says), std::string::npos)
        << c.body << " -> " << r.status();
  }
}

// The binary tensor data extension: the JSON's length in the header, each binary input's bytes
// after it in the inputs' order, and every way the layout can be wrong.
TEST(OipJson, BinaryInputsComeAfterTheJsonInOrder) {
  const std::string json =
      R"({"inputs":[{"name":"a","datatype":"INT32","shape":[2],"parameters":{"binary_data_size":8}},)"
      R"({"name":"j","datatype":"UINT8","shape":[1],"data":[9]},)"
      R"({"name":"t","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":6}}],)"
      R"("outputs":[{"name":"x","parameters":{"binary_data":true}}],)"
      R"("parameters":{"binary_data_output":false}})";
  const int32_t a[2] = {-1, 7};
  std::string t;
  AppendBytesElement("hi", &t);
  const std::string body = json + std::string(reinterpret_cast<const char*>(a), 8) + t;
  auto r = ParseInferJson(body, "m", "", std::to_string(json.size()));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->inputs.size(), 3u);
  EXPECT_EQ(r->inputs[0].data, std::string(reinterpret_cast<const char*>(a), 8));
  EXPECT_EQ(r->inputs[1].data, "\x09");
  EXPECT_EQ(BytesElements(r->inputs[2])[0], "hi");
  auto binary = TakeBinaryOutputs(&*r);
  ASSERT_TRUE(binary.ok()) << binary.status();
  EXPECT_TRUE(binary->Of("x"));
  EXPECT_FALSE(binary->Of("y"));
  EXPECT_TRUE(r->parameters.empty()) << "the transport parameters are taken out";
  EXPECT_TRUE(r->outputs[0].parameters.empty());

  const struct {
    std::string body, header, says;
  } bad[] = {
      {body, std::to_string(body.size() + 1), "but the body has only"},
      {body, "1e3", "a whole number"},
      {body.substr(0, body.size() - 1), std::to_string(json.size()), "binary_data_size is 6"},
      {body + "z", std::to_string(json.size()), "1 bytes after the JSON belong to no input"},
      {json + std::string(8, '\0') + std::string("\x05\0\0\0hi", 6), std::to_string(json.size()),
       "input t"},  // a BYTES element longer than its tensor
  };
  for (const auto& c : bad) {
    auto e = ParseInferJson(c.body, "m", "", c.header);
    ASSERT_FALSE(e.ok()) << c.says;
    EXPECT_NE(Message(e.status()).find(c.says), std::string::npos) << e.status();
  }
  InferRequest notbool;
  notbool.parameters["binary_data_output"] = int64_t{1};
  EXPECT_FALSE(TakeBinaryOutputs(&notbool).ok());
}

// A classifier's response to one image: probabilities FP32 [1, 2] (0.25, 0.75), label "Sneaker".
InferResponse ClassifierResponse() {
  InferResponse r;
  r.model = "m";
  r.version = "1";
  Tensor p{"probabilities", DataType::kFp32, {1, 2}, {}};
  const float v[2] = {0.25f, 0.75f};
  p.data.assign(reinterpret_cast<const char*>(v), sizeof(v));
  Tensor l{"label", DataType::kBytes, {1}, {}};
  AppendBytesElement("Sneaker", &l.data);
  r.outputs = {p, l};
  return r;
}

TEST(OipJson, BinaryOutputsFollowTheJson) {
  const InferResponse r = ClassifierResponse();
  const Tensor& p = r.outputs[0];
  const Tensor& l = r.outputs[1];
  BinaryOutputs all;
  all.all = true;
  const InferResponseBody b = ResponseBodyOf(r, all);
  ASSERT_GT(b.json_length, 0);
  const auto j = nlohmann::json::parse(b.body.substr(0, b.json_length));
  EXPECT_EQ(j["outputs"][0]["parameters"]["binary_data_size"], 8);
  EXPECT_FALSE(j["outputs"][0].contains("data"));
  EXPECT_EQ(j["outputs"][1]["parameters"]["binary_data_size"], 11);
  EXPECT_EQ(b.body.substr(b.json_length), p.data + l.data);
  BinaryOutputs one;  // the label as JSON, the probabilities binary
  one.per_output["probabilities"] = true;
  const InferResponseBody c = ResponseBodyOf(r, one);
  const auto k = nlohmann::json::parse(c.body.substr(0, c.json_length));
  EXPECT_EQ(k["outputs"][1]["data"], nlohmann::json({"Sneaker"}));
  EXPECT_EQ(c.body.substr(c.json_length), p.data);
  EXPECT_EQ(ResponseBodyOf(r, {}).json_length, -1);  // no binary output: plain JSON
}

TEST(OipJson, ResponseCarriesFlatDataAndTheId) {
  InferResponse r = ClassifierResponse();
  r.id = "q";
  const auto j = nlohmann::json::parse(InferResponseJson(r));
  EXPECT_EQ(j["id"], "q");
  EXPECT_EQ(j["model_version"], "1");
  EXPECT_EQ(j["outputs"][0]["data"], nlohmann::json({0.25, 0.75}));
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json({1, 2}));
  EXPECT_EQ(j["outputs"][1]["data"], nlohmann::json({"Sneaker"}));
  EXPECT_EQ(nlohmann::json::parse(ErrorJson("bad \"x\""))["error"], "bad \"x\"");
}

TEST(OipTensor, BytesContentsAreCheckedElementByElement) {
  Tensor t{"t", DataType::kBytes, {2}, {}};
  AppendBytesElement("abc", &t.data);
  EXPECT_NE(Message(CheckContents(t)).find("1 BYTES elements, but shape [2] needs 2"),
            std::string::npos);
  AppendBytesElement("", &t.data);
  EXPECT_TRUE(CheckContents(t).ok());
  t.data.push_back('\x05');  // a cut-off length
  EXPECT_NE(Message(CheckContents(t)).find("cut off"), std::string::npos);
  t.data.resize(t.data.size() - 1);
  t.data.append(std::string("\x09\0\0\0ab", 6));  // claims 9 bytes, has 2
  EXPECT_NE(Message(CheckContents(t)).find("says 9 bytes but 2 are left"), std::string::npos);
}

TEST(OipParameters, NumbersComeAsAnyOfThreeTypes) {
  EXPECT_EQ(*IntegerParameter("n", Parameter{int64_t{4}}), 4);
  EXPECT_EQ(*IntegerParameter("n", Parameter{uint64_t{4}}), 4);
  EXPECT_EQ(*IntegerParameter("n", Parameter{4.0}), 4);
  EXPECT_FALSE(IntegerParameter("n", Parameter{4.5}).ok());
  EXPECT_FALSE(IntegerParameter("n", Parameter{uint64_t{1} << 63}).ok());
  EXPECT_NE(Message(IntegerParameter("n", Parameter{std::string("4")}).status())
                .find("parameter n must be an integer, got a string"),
            std::string::npos);
  EXPECT_EQ(*NumberParameter("t", Parameter{int64_t{1}}), 1.0);
  EXPECT_EQ(*NumberParameter("t", Parameter{0.5}), 0.5);
  EXPECT_FALSE(NumberParameter("t", Parameter{true}).ok());
}

TEST(OipProto, RawAndTypedContentsGiveTheSameTensor) {
  inference::ModelInferRequest raw;
  raw.set_model_name("m");
  auto* in = raw.add_inputs();
  in->set_name("c");
  in->set_datatype("INT32");
  in->add_shape(2);
  const int32_t v[2] = {-1, 3};
  raw.add_raw_input_contents(std::string(reinterpret_cast<const char*>(v), 8));
  inference::ModelInferRequest typed = raw;
  typed.clear_raw_input_contents();
  typed.mutable_inputs(0)->mutable_contents()->add_int_contents(-1);
  typed.mutable_inputs(0)->mutable_contents()->add_int_contents(3);
  (*typed.mutable_parameters())["seed"].set_uint64_param(9);
  auto a = FromProto(raw), b = FromProto(typed);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->inputs[0].data, b->inputs[0].data);
  EXPECT_EQ(std::get<uint64_t>(b->parameters.at("seed")), 9u);
}

TEST(OipProto, EachBadMessageNamesWhatIsWrong) {
  auto image = [] {
    inference::ModelInferRequest r;
    auto* in = r.add_inputs();
    in->set_name("image");
    in->set_datatype("UINT8");
    in->add_shape(2);
    return r;
  };
  auto expect = [](const inference::ModelInferRequest& r, const char* says) {
    auto got = FromProto(r);
    ASSERT_FALSE(got.ok()) << says;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(Message(got.status()).find(says), std::string::npos) << got.status();
  };
  auto r = image();
  r.add_raw_input_contents("ab");
  r.add_raw_input_contents("cd");
  expect(r, "raw_input_contents has 2 entries for 1 inputs");
  r = image();
  r.add_raw_input_contents("ab");
  r.mutable_inputs(0)->mutable_contents()->add_uint_contents(1);
  expect(r, "use one or the other");
  r = image();
  r.mutable_inputs(0)->mutable_contents()->add_uint_contents(1);
  r.mutable_inputs(0)->mutable_contents()->add_uint_contents(300);
  expect(r, "value 300 does not fit UINT8");
  r = image();
  r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
  r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
  expect(r, "typed contents in a field other than UINT8's");
  r = image();
  r.mutable_inputs(0)->mutable_contents()->add_uint_contents(1);
  expect(r, "1 bytes of data, but UINT8 [2] needs 2");
  r = image();
  r.mutable_inputs(0)->set_datatype("FLOAT");
  expect(r, "unknown datatype \"FLOAT\"");
  r = image();
  (*r.mutable_parameters())["empty"];
  expect(r, "parameter empty has no value");
}

TEST(OipProto, ResponsesGoRaw) {
  InferResponse r;
  r.model = "m";
  r.version = "1";
  r.outputs = {Tensor{"bits_per_dim", DataType::kFp64, {1}, std::string(8, '\0')}};
  inference::ModelInferResponse out;
  ToProto(r, &out);
  ASSERT_EQ(out.outputs_size(), 1);
  EXPECT_EQ(out.outputs(0).datatype(), "FP64");
  EXPECT_FALSE(out.outputs(0).has_contents());
  ASSERT_EQ(out.raw_output_contents_size(), 1);
  EXPECT_EQ(out.raw_output_contents(0).size(), 8u);
}

TEST(HttpStatus, TheProtocolsCodes) {
  EXPECT_EQ(HttpStatus(absl::StatusCode::kOk), 200);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kFailedPrecondition), 400);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kInternal), 500);
}

}  // namespace
}  // namespace krause::server::oip
