// libFuzzer: an Open Inference Protocol REST body (JSON) through ParseInferJson, the decoding of
// its tensors (datatypes, shapes, nested data, parameters). An input that starts with 'B' is a
// body of the binary tensor data extension: its next two bytes give the JSON's length (the
// Inference-Header-Content-Length header), the rest is the body. Whatever the bytes: no crash, no
// sanitizer report, and an accepted request holds only tensors whose raw bytes agree with their
// datatype and shape; echoing its tensors as a response, as JSON and as binary data, encodes
// without throwing.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "server/oip/oip.h"
#include "server/oip/oip_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace oip = krause::server::oip;
  std::string body(reinterpret_cast<const char*>(data), size);
  std::optional<std::string> header_length;
  if (size >= 3 && data[0] == 'B') {
    header_length = std::to_string(data[1] | (data[2] << 8));
    body = body.substr(3);
  }
  auto request = header_length ? oip::ParseInferJson(body, "m", "", *header_length)
                               : oip::ParseInferJson(body, "m", "");
  if (!request.ok()) {
    if (request.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  oip::InferResponse echo;
  echo.id = request->id;
  for (const oip::Tensor& t : request->inputs) {
    if (!oip::CheckContents(t).ok()) std::abort();
    if (t.datatype == oip::DataType::kBytes) {
      auto n = oip::ElementCount(t.shape, "t");
      if (!n.ok() || static_cast<int64_t>(oip::BytesElements(t).size()) != *n) std::abort();
    }
    echo.outputs.push_back(t);
  }
  const std::string json = oip::InferResponseJson(echo);
  if (json.empty()) std::abort();
  auto binary = oip::TakeBinaryOutputs(&*request);
  if (binary.ok()) {
    binary->all = true;
    const oip::InferResponseBody b = oip::ResponseBodyOf(echo, *binary);
    if (!echo.outputs.empty() && b.json_length < 0) std::abort();
  }
  return 0;
}
