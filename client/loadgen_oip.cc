// krause-loadgen's Open Inference Protocol driver (--protocol oip, loadgen_drivers.h): the
// workload's call as ModelInfer on inference.GRPCInferenceService. Images go as one raw UINT8
// [k, H, W, C] input; generation as parameters (num_images, a seed per call), one unary call per
// request, so without the stream's chunk figures.
#include <algorithm>

#include "client/loadgen_drivers.h"

namespace krause::loadgen {
namespace {

class OipDriver : public Driver {
 public:
  OipDriver(LoadGen* gen, std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs)
      : gen_(gen), stubs_(std::move(stubs)) {}

  void Issue(uint64_t n, bool classify, int k, bool measured, std::function<void()> done) override {
    const LoadOptions& o = gen_->options();
    const std::string what = o.workload == "score" ? "score" : classify ? "classify" : "generate";
    auto& stub = *stubs_[n % stubs_.size()];
    inference::ModelInferRequest req;
    int64_t images = k;
    if (what == "generate") {
      const std::string& m = o.generate_model;
      req.set_model_name(m.empty() ? "karm-fmnist" : m);
      images = std::max(1, o.generate_images);
      (*req.mutable_parameters())["num_images"].set_int64_param(images);
      (*req.mutable_parameters())["seed"].set_uint64_param(n);
    } else {
      const std::string& m = what == "score" ? o.generate_model : gen_->classify_model_name();
      req.set_model_name(m.empty() ? "karm-fmnist" : m);
      const v1::RawImage& first = gen_->image(n * k).raw();
      auto* in = req.add_inputs();
      in->set_name("image");
      in->set_datatype("UINT8");
      for (int64_t d :
           {int64_t{k}, int64_t{first.height()}, int64_t{first.width()}, int64_t{first.channels()}})
        in->add_shape(d);
      std::string* raw = req.add_raw_input_contents();
      for (int i = 0; i < k; ++i) *raw += gen_->image(n * k + i).raw().pixels();
    }
    gen_->Unary<inference::ModelInferResponse>(
        "ModelInfer", std::move(req), images, measured, std::move(done),
        [&stub](auto&&... a) { stub.async()->ModelInfer(a...); });
  }

 private:
  LoadGen* gen_;
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs_;
};

}  // namespace

std::unique_ptr<Driver> MakeOipDriver(
    LoadGen* gen, std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs) {
  return std::make_unique<OipDriver>(gen, std::move(stubs));
}

}  // namespace krause::loadgen
