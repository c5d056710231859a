// krause-client's subcommands (client/main.cc parses the flags and dispatches to them) and what
// they share: the error exits, the input images (PNG files, or IDX files sliced with --index),
// the images per call, and the class a call asks for. The subcommands read the flags of
// client/flags.h; each returns the exit code: 0, or 1 on an error.
//   commands_inputs.cc    the shared helpers below
//   commands_info.cc      list, health
//   commands_images.cc    classify, score, inspect
//   commands_generate.cc  generate, complete
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/connection.h"
#include "krause/v1/krause.grpc.pb.h"

namespace krause::client::cli {

// "krause-client: WHAT" on stderr; returns 1.
int Fail(const std::string& what);
int FailRpc(const char* rpc, const grpc::Status& st, const ConnectionOptions& o);

// Images from the command line: PNG files, or IDX files sliced with --index.
struct InputImage {
  std::string name;
  v1::Image image;
};

absl::StatusOr<std::vector<InputImage>> ReadInputs(const std::vector<std::string>& files);

// Images per call for `model` (empty: the server's default of `kind`): --batch, and at most the
// model's max_images_per_request.
absl::StatusOr<int> ImagesPerCall(v1::KrauseService::Stub& stub, const ConnectionOptions& o,
                                  v1::ModelInfo::Kind kind);

// --label / --class_index: the class a call asks for (none when neither is given).
struct ClassChoice {
  std::string label;
  int32_t index = -1;
  bool any() const { return !label.empty() || index >= 0; }
};

absl::StatusOr<ClassChoice> ChosenClass();

// Score: each input's class (-1: none), from --labels_file (an IDX label file sliced like the
// images) or one --label / --class_index for all; empty when none is given.
absl::StatusOr<std::vector<int64_t>> ScoreIndices(size_t n);

int List(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json);
int Health(const std::shared_ptr<grpc::Channel>& channel, const ConnectionOptions& o, bool as_json);
int Classify(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
             const std::vector<std::string>& files);
int Score(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
          const std::vector<std::string>& files);
int Inspect(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
            const std::string& file);
// generate, or complete when `prompt_file` is not empty.
int Generate(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
             const std::string& prompt_file);

}  // namespace krause::client::cli
