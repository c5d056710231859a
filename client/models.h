// krause-client models: model control (LoadModel, UnloadModel, RepositoryIndex) from the
// command line.
//   models index [--ready]          every model and version of the repository, with its state
//   models load NAME [--model_version V]    load or reload (the policy's versions, or V)
//   models unload NAME [--model_version V]  stop serving it (every version, or V)
#pragma once

#include <string>
#include <vector>

#include "client/connection.h"
#include "krause/v1/krause.grpc.pb.h"

namespace krause::client {

// `args`: the words after "models". Exit code: 0, 1 on an error, 2 on bad usage.
int Models(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
           const std::vector<std::string>& args, const std::string& version, bool ready_only);

}  // namespace krause::client
