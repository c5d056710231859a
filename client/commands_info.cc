// krause-client list and health: the models a server serves (a table, or --json), and the
// gRPC health of the server or one of its services.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/flags.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace krause::client::cli {

using nlohmann::json;

int List(v1::KrauseService::Stub& stub, const ConnectionOptions& o, bool as_json) {
  grpc::ClientContext ctx;
  krause::client::PrepareContext(o, &ctx);
  v1::ListModelsResponse r;
  const grpc::Status st = stub.ListModels(&ctx, v1::ListModelsRequest(), &r);
  if (!st.ok()) return FailRpc("list", st, o);
  if (as_json) {
    json j = json::array();
    for (const auto& m : r.models()) {
      json t = {{"name", m.name()},
                {"version", m.version()},
                {"kind", v1::ModelInfo::Kind_Name(m.kind())},
                {"attention", v1::ModelInfo::Attention_Name(m.attention())},
                {"default", m.is_default()},
                {"shape", {m.height(), m.width(), m.channels()}},
                {"labels", std::vector<std::string>(m.labels().begin(), m.labels().end())},
                {"classes", m.classes()},
                {"window", m.window()},
                {"top_k", std::vector<uint32_t>(m.top_k().begin(), m.top_k().end())},
                {"parameters", m.parameters()},
                {"flops_per_image_executed", m.flops_per_image_executed()},
                {"flops_per_image_dense_equivalent", m.flops_per_image_dense_equivalent()},
                {"device", m.device()},
                {"implementation", m.implementation()},
                {"weights_dtype", m.weights_dtype()},
                {"precision", m.precision()},
                {"max_batch_size", m.max_batch_size()},
                {"max_images_per_request", m.max_images_per_request()}};
      if (!m.cpu_kernels().empty()) t["cpu_kernels"] = m.cpu_kernels();
      if (!m.linear_kernels().empty()) t["linear_kernels"] = m.linear_kernels();
      if (!m.precision_fallback().empty()) t["precision_fallback"] = m.precision_fallback();
      if (!m.kv_cache_dtype().empty()) {
        t["kv_cache_dtype"] = m.kv_cache_dtype();
        t["kv_cache_bytes_per_sequence"] = m.kv_cache_bytes_per_sequence();
      }
      json checks = json::array();
      for (const auto& c : m.kernel_checks())
        checks.push_back({{"implementation", c.implementation()},
                          {"device", c.device()},
                          {"result", c.result()},
                          {"max_abs_diff", c.max_abs_diff()},
                          {"tolerance", c.tolerance()},
                          {"detail", c.detail()},
                          {"seconds", c.seconds()}});
      t["kernel_checks"] = checks;
      j.push_back(t);
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%-20s %-4s %-10s %-8s %-9s %-15s %10s %9s %9s %7s  %s\n", "NAME", "VER", "KIND",
              "ATTN", "SHAPE", "IMPL", "PARAMS", "MFLOP/IMG", "DENSE-EQ", "SAVING", "DEFAULT");
  for (const auto& m : r.models()) {
    const double ex = m.flops_per_image_executed() / 1e6,
                 de = m.flops_per_image_dense_equivalent() / 1e6;
    // IMPL: what the kernel check chose, and where ("fused_cpu/cpu", "windowed/cuda:0").
    std::printf("%-20s %-4s %-10s %-8s %-9s %-15s %10llu %9.2f %9.2f %6.1f%%  %s\n",
                m.name().c_str(), m.version().c_str(), v1::ModelInfo::Kind_Name(m.kind()).c_str(),
                v1::ModelInfo::Attention_Name(m.attention()).c_str(),
                absl::StrCat(m.height(), "x", m.width(), "x", m.channels()).c_str(),
                absl::StrCat(m.implementation(), "/", m.device()).c_str(),
                static_cast<unsigned long long>(m.parameters()), ex, de,
                de > 0 ? 100.0 * (1.0 - ex / de) : 0.0, m.is_default() ? "yes" : "");
  }
  return 0;
}

int Health(const std::shared_ptr<grpc::Channel>& channel, const ConnectionOptions& o,
           bool as_json) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  krause::client::PrepareContext(o, &ctx);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse r;
  const grpc::Status st = stub->Check(&ctx, req, &r);
  if (!st.ok()) return FailRpc("health", st, o);
  const std::string status = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(r.status());
  if (as_json) {
    std::cout << json{{"service", req.service()}, {"status", status}}.dump() << "\n";
  } else {
    std::printf("%s\n", status.c_str());
  }
  return r.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace krause::client::cli
