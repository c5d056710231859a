#include "client/models.h"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace krause::client {
namespace {

template <typename Entries>
int Print(const Entries& entries, bool as_json) {
  if (as_json) {
    nlohmann::json j = nlohmann::json::array();
    for (const v1::RepositoryEntry& e : entries)
      j.push_back({{"name", e.name()},
                   {"version", e.version()},
                   {"state", v1::RepositoryEntry::State_Name(e.state())},
                   {"reason", e.reason()}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%-24s %-8s %-12s %s\n", "NAME", "VERSION", "STATE", "REASON");
  for (const v1::RepositoryEntry& e : entries)
    std::printf("%-24s %-8s %-12s %s\n", e.name().c_str(),
                e.version().empty() ? "-" : e.version().c_str(),
                v1::RepositoryEntry::State_Name(e.state()).c_str(), e.reason().c_str());
  return 0;
}

int Failed(const char* rpc, const grpc::Status& st, const ConnectionOptions& o) {
  std::fprintf(stderr, "krause-client: %s failed: %s\n", rpc, Explain(st, o).c_str());
  return 1;
}

}  // namespace

int Models(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json,
           const std::vector<std::string>& args, const std::string& version, bool ready_only) {
  grpc::ClientContext ctx;
  PrepareContext(o, &ctx);
  const std::string& what = args[0];
  if (what == "index" && args.size() == 1) {
    v1::RepositoryIndexRequest req;
    req.set_ready_only(ready_only);
    v1::RepositoryIndexResponse r;
    const grpc::Status st = stub.RepositoryIndex(&ctx, req, &r);
    if (!st.ok()) return Failed("models index", st, o);
    return Print(r.models(), as_json);
  }
  if (what == "load" && args.size() == 2) {
    v1::LoadModelRequest req;
    req.set_name(args[1]);
    req.set_version(version);
    v1::LoadModelResponse r;
    const grpc::Status st = stub.LoadModel(&ctx, req, &r);
    if (!st.ok()) return Failed("models load", st, o);
    return Print(r.versions(), as_json);
  }
  if (what == "unload" && args.size() == 2) {
    v1::UnloadModelRequest req;
    req.set_name(args[1]);
    req.set_version(version);
    v1::UnloadModelResponse r;
    const grpc::Status st = stub.UnloadModel(&ctx, req, &r);
    if (!st.ok()) return Failed("models unload", st, o);
    return Print(r.versions(), as_json);
  }
  std::fprintf(stderr,
               "krause-client: models index | models load NAME | models unload NAME "
               "[--model_version V]; see --help\n");
  return 2;
}

}  // namespace krause::client
