// libFuzzer: an Open Inference Protocol REST body (JSON) through ParseInferJson, the decoding of
// its tensors (datatypes, shapes, nested data, parameters). Whatever the bytes: no crash, no
// sanitizer report, and an accepted request holds only tensors whose raw bytes agree with their
// datatype and shape; echoing its tensors as a response encodes without throwing.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/oip/oip.h"
#include "server/oip/oip_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace oip = krause::server::oip;
  const std::string body(reinterpret_cast<const char*>(data), size);
  auto request = oip::ParseInferJson(body, "m", "");
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
  return 0;
}
