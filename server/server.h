// KrauseServer: the gRPC server with KrauseService, the Open Inference Protocol's
// GRPCInferenceService (oip_service.h), health and reflection, and the HTTP port's front door
// (edge/http_front_door.h) with its routes: the Open Inference Protocol's REST API (oip_http.h),
// krause.v1 over Connect and its generation over HTTP (v1/), OpenAI's Images API (openai/), the
// web page. Start() listens at
// once with health NOT_SERVING, loads the models, then turns SERVING. Shutdown() drains:
// NOT_SERVING, new calls refused with UNAVAILABLE, in-flight calls get `drain_seconds` to
// finish, then the rest are cancelled (UNAVAILABLE "shutting down") and the server stops.
// Thread-safety: Shutdown() may be called from any thread (e.g. a signal thread), once or more.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/model_control.h"
#include "server/core/options.h"
#include "server/core/registry.h"
#include "server/edge/http_front_door.h"
#include "server/edge/metrics.h"
#include "server/oip/oip_http.h"
#include "server/oip/oip_service.h"
#include "server/openai/openai_http.h"
#include "server/v1/connect_http.h"
#include "server/v1/http_generation.h"
#include "server/v1/service.h"
#include "server/web/web_ui.h"

namespace krause::server {

class KrauseServer {
 public:
  // Returns once the server listens and the models are loaded (SERVING). `hooks` (optional)
  // receive worker events after the metrics do.
  static absl::StatusOr<std::unique_ptr<KrauseServer>> Start(const ServerOptions& options,
                                                             const WorkerHooks& hooks = {});
  ~KrauseServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }           // 0 when --metrics_listen is off
  int http_port() const { return http_ ? http_->port() : 0; }  // 0 when --http_listen is off
  const Metrics& metrics() const { return *metrics_; }
  const Registry& registry() const { return *registry_; }
  const Gate& gate() const { return gate_; }
  ModelControl* model_control() const { return model_control_.get(); }  // null without a repository
  void Shutdown();
  void Wait();

 private:
  KrauseServer() = default;
  void Log(const std::string& line) const;

  ServerOptions options_;
  Gate gate_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<RequestLog> request_log_;  // outlives the front ends that write to it
  FrontEndContext edge_;                     // what the front ends share
  std::unique_ptr<ReplyPool> replies_;       // goes before edge_: its tasks may use the fault hook
  std::unique_ptr<KrauseService> service_;
  std::unique_ptr<OipService> oip_service_;
  std::unique_ptr<OipRest> oip_rest_;     // the routes on the HTTP port (outlive http_)
  std::unique_ptr<ConnectHttp> connect_;  // krause.v1 over Connect
  std::unique_ptr<WebUi> web_ui_;         // the web page; null: off
  std::unique_ptr<HttpFrontDoor> http_;   // stopped in Shutdown, before the registry goes
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<ModelControl> model_control_;  // a repository's (goes before the registry)
  int port_ = 0;
  int metrics_port_ = 0;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace krause::server
