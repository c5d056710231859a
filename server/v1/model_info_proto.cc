#include "server/v1/model_info_proto.h"

#include "absl/strings/str_cat.h"

namespace krause::server {

v1::ModelInfo::Kind ToProto(ModelKind kind) {
  return kind == ModelKind::kClassifier ? v1::ModelInfo::CLASSIFIER : v1::ModelInfo::GENERATOR;
}

v1::ModelInfo ToProto(const ModelInfo& m) {
  v1::ModelInfo info;
  info.set_name(m.name);
  info.set_version(std::to_string(m.version));
  if (m.default_temperature)
    info.set_default_temperature(static_cast<float>(*m.default_temperature));
  if (m.default_top_p) info.set_default_top_p(static_cast<float>(*m.default_top_p));
  if (m.default_top_k) info.set_default_top_k(static_cast<uint32_t>(*m.default_top_k));
  if (m.default_guidance) info.set_default_guidance(static_cast<float>(*m.default_guidance));
  info.set_kind(ToProto(m.kind));
  info.set_attention(m.attention == AttentionKind::kKrause ? v1::ModelInfo::KRAUSE
                                                           : v1::ModelInfo::SOFTMAX);
  info.set_is_default(m.is_default);
  info.set_height(static_cast<uint32_t>(m.shape.height));
  info.set_width(static_cast<uint32_t>(m.shape.width));
  info.set_channels(static_cast<uint32_t>(m.shape.channels));
  for (const std::string& l : m.labels) info.add_labels(l);
  info.set_classes(static_cast<uint32_t>(m.classes));
  info.set_window(static_cast<uint32_t>(m.window));
  for (int64_t k : m.top_k) info.add_top_k(static_cast<uint32_t>(k));
  info.set_parameters(static_cast<uint64_t>(m.parameters));
  info.set_flops_per_image_executed(m.flops_per_image_executed);
  info.set_flops_per_image_dense_equivalent(m.flops_per_image_dense_equivalent);
  info.set_device(m.device);
  info.set_max_batch_size(static_cast<uint32_t>(m.max_batch_size));
  info.set_max_queue_delay_ms(static_cast<uint32_t>(m.max_queue_delay_ms));
  info.set_max_images_per_request(static_cast<uint32_t>(m.max_images_per_request));
  info.set_kv_cache_bytes_per_sequence(static_cast<uint64_t>(m.kv_cache_bytes_per_sequence));
  info.set_kv_cache_dtype(m.kv_cache_dtype);
  info.set_weights_dtype(m.weights_dtype);
  info.set_cpu_kernels(m.cpu_kernels);
  info.set_precision(m.precision);
  info.set_precision_fallback(m.precision_fallback);
  info.set_linear_kernels(m.linear_kernels);
  info.set_numerics(m.numerics);
  info.set_checkpoint(m.checkpoint);
  info.set_summary(m.summary);
  info.set_implementation(m.implementation);
  for (const KernelCheckRecord& r : m.kernel_checks) {
    v1::KernelCheck* c = info.add_kernel_checks();
    c->set_implementation(r.implementation);
    c->set_device(r.device);
    c->set_result(r.result);
    c->set_max_abs_diff(r.max_abs_diff);
    c->set_tolerance(r.tolerance);
    c->set_detail(r.detail);
    c->set_seconds(r.seconds);
  }
  return info;
}

std::string KernelCheckLine(const ModelInfo& m) {
  std::string line = absl::StrCat("model ", m.name, " version ", m.version, ": serving on ",
                                  m.implementation, " (", m.device);
  if (!m.cpu_kernels.empty()) absl::StrAppend(&line, ", ", m.cpu_kernels, " kernels");
  absl::StrAppend(&line, ", ", m.weights_dtype, " weights, ", m.precision, " precision");
  if (!m.linear_kernels.empty()) absl::StrAppend(&line, ", linear layers on ", m.linear_kernels);
  if (!m.precision_fallback.empty())
    absl::StrAppend(&line, "; bf16 was asked, fp32 serves: ", m.precision_fallback);
  absl::StrAppend(&line, "); kernel check: ");
  for (size_t i = 0; i < m.kernel_checks.size(); ++i)
    absl::StrAppend(&line, i > 0 ? "; " : "", m.kernel_checks[i].summary);
  return line;
}

}  // namespace krause::server
