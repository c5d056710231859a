#include "server/v1/unary.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "server/core/errors.h"
#include "server/v1/images.h"
#include "server/v1/model_info_proto.h"
#include "server/v1/requests.h"

namespace krause::server {
namespace {

struct ResolvedCall {
  ModelRef model;     // the call's book holds it too
  at::Tensor images;  // [n, H, W, C] uint8
};

// The common start of Classify and Score (after the gate): find the model of the kind, decode
// the images.
absl::StatusOr<ResolvedCall> ResolveImageCall(
    const UnaryCallContext& c, ModelKind kind, const std::string& model, const std::string& version,
    const google::protobuf::RepeatedPtrField<v1::Image>& images) {
  auto found = c.edge->registry.load()->Find(model, kind, version);
  if (!found.ok()) return found.status();
  c.book->set_model(*found);
  c.book->set_images(images.size());
  auto decoded = DecodeImages(images, **found, c.edge->fault);
  if (!decoded.ok()) return decoded.status();
  return ResolvedCall{*found, *decoded};
}

// The Classify reply from its rows of the batch's probabilities [n, classes]: per image the
// top_k classes and, with `full`, every probability.
void FillClassifyResponse(const at::Tensor& probs, int64_t top_k, bool full, const ModelInfo& info,
                          v1::ClassifyResponse* response) {
  const int64_t n = probs.size(0), k = probs.size(1);
  const float* p = probs.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* row = p + i * k;
    v1::Classification* c = response->add_results();
    for (int64_t j : TopClasses(row, k, top_k)) {
      v1::ClassScore* s = c->add_top();
      s->set_index(static_cast<uint32_t>(j));
      if (j < static_cast<int64_t>(info.labels.size())) s->set_label(info.labels[j]);
      s->set_probability(row[j]);
    }
    if (full) c->mutable_probabilities()->Add(row, row + k);
  }
}

// The Score reply: bits/dim per image and their mean.
void FillScoreResponse(const std::vector<double>& bits_per_dim, int64_t scored_per_image,
                       v1::ScoreResponse* response) {
  double sum = 0;
  for (double b : bits_per_dim) {
    response->add_bits_per_dim(b);
    sum += b;
  }
  response->set_mean_bits_per_dim(sum / static_cast<double>(bits_per_dim.size()));
  response->set_scored_subpixels_per_image(static_cast<uint32_t>(scored_per_image));
}

// The Inspect reply from an inspection.
void FillInspectResponse(const Inspection& in, const ServedModel& m, v1::InspectResponse* r) {
  r->set_model(m.name());
  r->set_model_version(std::to_string(m.info().version));
  r->set_attention(in.krause ? v1::ModelInfo::KRAUSE : v1::ModelInfo::SOFTMAX);
  r->set_kind(m.kind() == ModelKind::kClassifier ? v1::ModelInfo::CLASSIFIER
                                                 : v1::ModelInfo::GENERATOR);
  r->set_implementation(m.info().implementation);
  r->set_tokens(static_cast<uint32_t>(in.tokens));
  for (int64_t q : in.queries) r->add_queries(static_cast<uint32_t>(q));
  int64_t rows = 0, columns = 0;
  for (const auto& [row, column] : in.positions) {
    r->add_token_rows(static_cast<int32_t>(row));
    r->add_token_columns(static_cast<int32_t>(column));
    rows = std::max(rows, row + 1);
    columns = std::max(columns, column + 1);
  }
  r->set_grid_height(static_cast<uint32_t>(rows));
  r->set_grid_width(static_cast<uint32_t>(columns));
  for (const LayerAttention& layer : in.layers) {
    v1::LayerAttention* l = r->add_layers();
    l->set_layer(static_cast<uint32_t>(layer.layer));
    l->set_keys_per_query(static_cast<uint32_t>(layer.k));
    for (const HeadAttention& head : layer.heads) {
      v1::HeadAttention* h = l->add_heads();
      h->set_head(static_cast<uint32_t>(head.head));
      h->set_sigma(static_cast<float>(head.sigma));
      h->set_sink_share(head.sink_share);
      h->set_mean_distance(head.mean_distance);
      h->set_effective_neighbours(head.effective_neighbours);
      h->set_busiest_key(static_cast<uint32_t>(head.busiest_key));
      h->set_busiest_key_share(head.busiest_key_share);
      for (const QueryAttention& qa : head.queries) {
        v1::QueryAttention* q = h->add_queries();
        q->set_query(static_cast<uint32_t>(qa.query));
        for (int64_t key : qa.keys) q->add_keys(static_cast<uint32_t>(key));
        q->mutable_weights()->Add(qa.weights.begin(), qa.weights.end());
        q->set_outside(qa.outside);
      }
    }
  }
}

}  // namespace

absl::Status StartListModels(const UnaryCallContext& c, const v1::ListModelsRequest&,
                             v1::ListModelsResponse* response, UnaryDone done) {
  for (const auto& m : c.edge->registry.load()->models())
    *response->add_models() = ToProto(m->info());
  done(absl::OkStatus());
  return absl::OkStatus();
}

absl::Status StartGetModel(const UnaryCallContext& c, const v1::GetModelRequest& request,
                           v1::ModelInfo* response, UnaryDone done) {
  if (request.name().empty()) return InvalidField("name", "name is required");
  auto m = c.edge->registry.load()->FindAny(request.name(), request.version());
  if (!m.ok()) return m.status();
  c.book->set_model(*m);
  *response = ToProto((*m)->info());
  done(absl::OkStatus());
  return absl::OkStatus();
}

absl::Status StartClassify(const UnaryCallContext& c, const v1::ClassifyRequest& request,
                           v1::ClassifyResponse* response, UnaryDone done) {
  auto r = ResolveImageCall(c, ModelKind::kClassifier, request.model(), request.version(),
                            request.images());
  if (!r.ok()) return r.status();
  const ModelRef m = r->model;
  if (absl::Status st = c.book->SetPriority(request.priority(), "priority"); !st.ok()) return st;
  CallLimits limits = c.limits;
  limits.share = c.book->share();
  const int64_t top_k = request.top_k() == 0 ? 5 : request.top_k();  // clipped to the classes
  const bool full = request.return_probabilities();
  const FrontEndContext* edge = c.edge;
  CallBook* book = c.book;
  auto finish = [edge, book, response, top_k, full, m, done = std::move(done)](
                    absl::StatusOr<at::Tensor> probs, double queue_seconds) {
    if (queue_seconds > 0) book->Queued(queue_seconds);
    done(Guarded("Classify", [&]() -> absl::Status {
      edge->Fault("reply");
      if (!probs.ok()) return probs.status();
      response->set_model(m->name());
      response->set_model_version(std::to_string(m->info().version));
      FillClassifyResponse(*probs, top_k, full, m->info(), response);
      const CallFlops f = book->Served(probs->size(0));
      response->set_flops_executed(f.executed);
      response->set_flops_dense_equivalent(f.dense_equivalent);
      return absl::OkStatus();
    }));
  };
  return m->Classify(r->images, limits, edge->replies, std::move(finish));
}

absl::Status StartScore(const UnaryCallContext& c, const v1::ScoreRequest& request,
                        v1::ScoreResponse* response, UnaryDone done) {
  auto r = ResolveImageCall(c, ModelKind::kGenerator, request.model(), request.version(),
                            request.images());
  if (!r.ok()) return r.status();
  const ModelRef m = r->model;
  auto classes = ScoreClasses(request, *m, r->images.size(0));
  if (!classes.ok()) return classes.status();
  const FrontEndContext* edge = c.edge;
  CallBook* book = c.book;
  auto finish = [edge, book, response, m,
                 done = std::move(done)](const absl::StatusOr<std::vector<double>>& bpd) {
    done(Guarded("Score", [&]() -> absl::Status {
      edge->Fault("reply");
      if (!bpd.ok()) return bpd.status();
      response->set_model(m->name());
      response->set_model_version(std::to_string(m->info().version));
      FillScoreResponse(*bpd, m->ScoredPerImage(), response);
      const CallFlops f = book->Served(static_cast<int64_t>(bpd->size()));
      response->set_flops_executed(f.executed);
      response->set_flops_dense_equivalent(f.dense_equivalent);
      return absl::OkStatus();
    }));
  };
  return m->Score(r->images, std::move(*classes), c.limits, edge->replies, std::move(finish));
}

absl::Status StartInspect(const UnaryCallContext& c, const v1::InspectRequest& request,
                          v1::InspectResponse* response, UnaryDone done) {
  const Registry& registry = *c.edge->registry.load();
  // Any classifier or generator; the default classifier when the name is empty.
  auto found = request.model().empty()
                   ? registry.Find("", ModelKind::kClassifier, request.version())
                   : registry.FindAny(request.model(), request.version());
  if (!found.ok()) return found.status();
  const ModelRef m = *found;
  c.book->set_model(m);
  c.book->set_images(1);
  c.edge->Fault("decode");
  auto image = DecodeImage(request.image(), "image", ImageBounds{m->info().shape, m->name()});
  if (!image.ok()) return image.status();
  InspectOptions o;
  o.layers.assign(request.layers().begin(), request.layers().end());
  o.queries.assign(request.queries().begin(), request.queries().end());
  o.top_k = request.top_k();
  o.max_entries = c.edge->inspect_max_entries;
  int64_t class_row = -1;
  if (request.condition_case() != v1::InspectRequest::CONDITION_NOT_SET) {
    const bool by_name = request.condition_case() == v1::InspectRequest::kLabel;
    auto cls = m->ClassRow(by_name, request.label(), request.class_index(),
                           by_name ? "label" : "class_index");
    if (!cls.ok()) return cls.status();
    class_row = *cls;
  }
  const FrontEndContext* edge = c.edge;
  auto finish = [edge, response, m, done = std::move(done)](absl::StatusOr<Inspection> inspection) {
    done(Guarded("Inspect", [&]() -> absl::Status {
      edge->Fault("reply");
      if (!inspection.ok()) return inspection.status();
      FillInspectResponse(*inspection, *m, response);
      return absl::OkStatus();
    }));
  };
  return m->Inspect(*image, class_row, std::move(o), c.limits, edge->replies, std::move(finish));
}

}  // namespace krause::server
