// krause-loadgen's protocol drivers (--protocol), one a file: krause.v1 (loadgen_krause.cc), the
// Open Inference Protocol's ModelInfer over gRPC (loadgen_oip.cc), and REST infer and
// generate_stream over HTTP (loadgen_http.cc). Each builds the workload's call of its protocol,
// records it in the LoadGen that owns it (loadgen.h) and reports its end there.
#pragma once

#include <memory>
#include <vector>

#include "client/http_load.h"
#include "client/loadgen.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "krause/v1/krause.grpc.pb.h"

namespace krause::loadgen {

// krause.v1: GetModel (the RPC floor), Score, Classify, and Generate as a stream (with --resume
// through client::ResumingGenerate); call n goes over stubs[n % stubs.size()].
std::unique_ptr<Driver> MakeKrauseDriver(
    LoadGen* gen, std::vector<std::unique_ptr<v1::KrauseService::Stub>> stubs);

// The Open Inference Protocol: classify, score and generate as ModelInfer (raw tensors; generate
// as one unary call, so without the stream's chunk figures).
std::unique_ptr<Driver> MakeOipDriver(
    LoadGen* gen, std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs);

// HTTP: classify as the REST infer (JSON tensors, or binary tensor data with --http_binary),
// generate as generate_stream (Server-Sent Events, with the stream's figures); with `openai`,
// generate as OpenAI's POST /v1/images/generations (one JSON answer; the same images).
std::unique_ptr<Driver> MakeHttpDriver(LoadGen* gen,
                                       std::unique_ptr<krause::client::HttpLoadClient> http,
                                       bool openai = false);

}  // namespace krause::loadgen
