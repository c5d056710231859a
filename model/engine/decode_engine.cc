#include "model/engine/decode_engine.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>

#include "absl/strings/str_cat.h"
#include "model/engine/cpu_decoder.h"
#include "model/util/status_macros.h"
#include "model/util/tensor_checks.h"

namespace krause {

absl::StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(const PixelModel* model,
                                                                   const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("model is null");
  int64_t slots = options.max_sequences;
  if (options.max_cache_bytes > 0) {
    slots = std::min(slots, options.max_cache_bytes / PixelKvCache::BytesPerSequence(
                                                          model->config(), options.cache_dtype));
  }
  if (slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cache holds no sequence: max_sequences ", options.max_sequences, ", max_cache_bytes ",
        options.max_cache_bytes, ", one sequence needs ",
        PixelKvCache::BytesPerSequence(model->config(), options.cache_dtype), " bytes"));
  }
  const KrauseImpl impl = options.attention_impl;
  const bool cpu = model->device().is_cpu();
  if (!(impl == KrauseImpl::kAuto || impl == KrauseImpl::kWindowed ||
        (impl == KrauseImpl::kFusedCpu && cpu) || (impl == KrauseImpl::kCuda && !cpu))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_impl ", KrauseImplName(impl), " cannot serve a model on ", model->device().str(),
        " (auto, windowed, or ", cpu ? "fused_cpu" : "cuda", ")"));
  }
  ASSIGN_OR_RETURN(PixelKvCache cache, PixelKvCache::Create(model->config(), slots, model->device(),
                                                            options.cache_dtype));
  RETURN_IF_ERROR(cache.SetDecodeImpl(ForwardImpl(impl)));
  try {  // packing the weights, pinned host buffers
    return std::unique_ptr<DecodeEngine>(new DecodeEngine(model, std::move(cache), slots, options));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot set up the decode engine: ", ExceptionMessage(e)));
  }
}

PixelDecodeWeights PackForServing(const PixelModel& model, KrauseImpl serving,
                                  Precision precision) {
  PixelDecodeWeights w = PackForDecode(model, precision);
  if (ForwardImpl(serving) == KrauseImpl::kWindowed) w.cpu = nullptr;
  return w;
}

DecodeEngine::DecodeEngine(const PixelModel* model, PixelKvCache cache, int64_t slots,
                           const EngineOptions& options)
    : model_(model),
      cache_dtype_(options.cache_dtype),
      forward_impl_(ForwardImpl(options.attention_impl)),
      device_(model->device()),
      packed_(PackForServing(*model, options.attention_impl, options.precision)),
      cache_(std::move(cache)),
      host_u_(device_.HostBuffer({slots}, at::kLong)),
      host_pos_(device_.HostBuffer({slots}, at::kLong)),
      host_slots_(device_.HostBuffer({slots}, at::kLong)),
      host_logits_(device_.HostBuffer({slots, 256}, at::kFloat)),
      pool_(slots) {
  if (options.precision == Precision::kBf16) {
    precision_fallback_ = cpu_decoder() != nullptr
                              ? cpu_decoder()->fallback()
                              : "bf16 is the packed CPU step's precision; this engine runs "
                                "LibTorch ops or a GPU in fp32";
  }
  if (options.cuda_graphs && forward_impl_ == KrauseImpl::kAuto &&
      DecodeGraphs::Supported(*model)) {
    graphs_ = std::make_unique<DecodeGraphs>(model, &cache_, &packed_, slots);
  }
  // The cache's zero fill, the scales and the graphs' buffers were made on the default stream;
  // the engine's steps run on its own.
  device_.WaitForDefaultStream();
}

absl::StatusOr<int64_t> DecodeEngine::Submit(GenerationRequest request) {
  RETURN_IF_ERROR(Validate(request));
  auto s = std::make_unique<Sequence>();
  s->request = std::move(request);
  std::lock_guard<std::mutex> lock(mu_);
  s->id = next_id_++;
  const int64_t id = s->id;
  pending_.push_back(std::move(s));
  return id;
}

absl::Status DecodeEngine::Validate(const GenerationRequest& request) const {
  RETURN_IF_ERROR(ValidateSampling(request.sampling));
  const int64_t n = model_->config().seq_len();
  if (static_cast<int64_t>(request.prompt.size()) > n - 1) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", request.prompt.size(),
                                                   " subpixels; at most ", n - 1, " (N - 1)"));
  }
  RETURN_IF_ERROR(model_->config().ClassRow(request.label).status());
  RETURN_IF_ERROR(ValidateGuidance(request.guidance, request.label));
  if (request.slots() > pool_.capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("guidance needs ", request.slots(),
                                                   " cache slots per image; this engine has ",
                                                   pool_.capacity()));
  }
  if (request.share.max_slots > 0 && request.slots() > request.share.max_slots) {
    return absl::InvalidArgumentError(absl::StrCat("guidance needs ", request.slots(),
                                                   " cache slots per image; the tenant may hold ",
                                                   request.share.max_slots, " (max_slots)"));
  }
  if (!(request.share.weight > 0) || !std::isfinite(request.share.weight)) {
    return absl::InvalidArgumentError(
        absl::StrCat("share weight must be positive and finite, not ", request.share.weight));
  }
  return absl::OkStatus();
}

void DecodeEngine::Cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.insert(id);
}

int64_t DecodeEngine::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(pending_.size());
}

bool DecodeEngine::Busy() const { return !active_.empty() || waiting() > 0; }

absl::Status DecodeEngine::Admit(Sequence* s, StepOutput* out) {
  out->admitted.push_back(s->id);
  const PixelModelConfig& c = model_->config();
  if (cache_.conditional()) {
    try {
      cache_.SetClass(s->slot, *c.ClassRow(s->request.label));  // validated by Submit
      if (s->guide_slot >= 0) cache_.SetClass(s->guide_slot, c.null_class());
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("setting the class failed: ", ExceptionMessage(e)));
    }
  }
  s->pixels = s->request.prompt;
  // Known model inputs u: with a start token [START, prompt...] (u_p predicts x_p), without one
  // [prompt...] (u_p predicts x_{p+1}; an empty prompt starts from x_0 drawn uniformly).
  std::vector<int64_t> u;
  if (c.start_token) {
    u.push_back(PixelModel::kStartToken);
  } else if (s->pixels.empty()) {
    const uint8_t x0 = static_cast<uint8_t>(CounterUniform(s->request.sampling.seed, 0) * 256);
    s->pixels.push_back(x0);
    out->pixels.push_back({s->id, 0, x0});
  }
  for (uint8_t px : s->pixels) u.push_back(px);
  // Prefill everything but the last known input; the decode step feeds that one. (That is
  // PrefillPositions(prompt size), what Waiting() tells the planner: decode_engine_test checks.)
  const int64_t prefix = static_cast<int64_t>(u.size()) - 1;
  try {
    if (prefix > 0) {
      const at::Tensor known = at::tensor(std::vector<int64_t>(u.begin(), u.end() - 1), at::kLong);
      // On the CPU the packed prefill: bit for bit what decode steps over the same positions
      // give, so a completion from an image's first subpixels continues it exactly.
      model_->Prefill(known, s->slot, &cache_, forward_impl_, &packed_);
      if (s->guide_slot >= 0)
        model_->Prefill(known, s->guide_slot, &cache_, forward_impl_, &packed_);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("prefill failed: ", ExceptionMessage(e)));
  }
  s->position = prefix;
  s->input = u.back();
  return absl::OkStatus();
}

void DecodeEngine::Finish(Sequence* s, absl::Status status, StepOutput* out) {
  for (int64_t* slot : {&s->slot, &s->guide_slot}) {
    if (*slot >= 0) {
      pool_.Release(*slot);
      *slot = -1;
    }
  }
  StepStats& stats = out->stats;
  if (status.ok()) {
    ++stats.finished;
  } else if (absl::IsCancelled(status)) {
    ++stats.cancelled;
  } else {
    ++stats.failed;
  }
  StepOutput::Finished& f = out->finished.emplace_back();
  f.id = s->id;
  // A request that never got a slot has no pixels (its prompt is not copied in before Admit).
  f.sampled = std::max<int64_t>(
      0, static_cast<int64_t>(s->pixels.size()) - static_cast<int64_t>(s->request.prompt.size()));
  if (status.ok()) f.image = std::move(s->pixels);
  f.status = std::move(status);
}

const float* DecodeEngine::RunDecodeStep(int64_t* rows) {
  const int64_t sequences = static_cast<int64_t>(active_.size());
  int64_t* u = host_u_.data_ptr<int64_t>();
  int64_t* pos = host_pos_.data_ptr<int64_t>();
  int64_t* slots = host_slots_.data_ptr<int64_t>();
  // Row i: active sequence i; then a row per guided sequence for its guide slot (same input and
  // position, the null class). Every slot is in at most one row, so rows <= slots.
  guide_rows_.assign(static_cast<size_t>(sequences), -1);
  int64_t batch = sequences;
  for (int64_t i = 0; i < sequences; ++i) {
    u[i] = active_[i]->input;
    pos[i] = active_[i]->position;
    slots[i] = active_[i]->slot;
    if (active_[i]->guide_slot >= 0) {
      u[batch] = active_[i]->input;
      pos[batch] = active_[i]->position;
      slots[batch] = active_[i]->guide_slot;
      guide_rows_[i] = batch++;
    }
  }
  *rows = batch;
  float* logits = host_logits_.data_ptr<float>();
  if (packed_.cpu != nullptr) {  // the packed CPU step: raw host arrays in and out
    const absl::Status st = packed_.cpu->Step(u, pos, slots, batch, &cache_, logits);
    TORCH_CHECK(st.ok(), st.ToString());
    return logits;
  }
  const at::Tensor hu = host_u_.narrow(0, 0, batch), hp = host_pos_.narrow(0, 0, batch),
                   hs = host_slots_.narrow(0, 0, batch);
  const at::Tensor out = graphs_ != nullptr ? graphs_->Step(hu, hp, hs)
                                            : model_->DecodeStep(hu, hp, hs, &cache_, &packed_);
  // On a GPU this waits for the step (the copy is ordered after it on the engine's stream).
  host_logits_.narrow(0, 0, batch).copy_(out);
  return logits;
}

std::vector<WaitingRequest> DecodeEngine::Waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return WaitingLocked();
}

std::vector<WaitingRequest> DecodeEngine::WaitingLocked() const {
  const bool start = model_->config().start_token;
  std::vector<WaitingRequest> out;
  out.reserve(pending_.size());
  for (const auto& s : pending_) {
    const int64_t slots = s->request.slots();
    // Admit() prefills on each of the request's slots.
    out.push_back({s->id, slots,
                   slots * PrefillPositions(static_cast<int64_t>(s->request.prompt.size()), start),
                   s->request.share});
  }
  return out;
}

std::vector<GroupSlots> DecodeEngine::HeldSlots() const {
  std::vector<GroupSlots> held;
  for (const auto& s : active_) {
    const FairShare& share = s->request.share;
    auto it = std::find_if(held.begin(), held.end(),
                           [&](const GroupSlots& h) { return h.share.group == share.group; });
    if (it == held.end()) it = held.insert(held.end(), GroupSlots{share, 0});
    it->slots += s->request.slots();
  }
  return held;
}

StepOutput DecodeEngine::Step() { return Run(nullptr); }

StepOutput DecodeEngine::Step(const AdmissionPlan& plan) { return Run(&plan); }

StepOutput DecodeEngine::Run(const AdmissionPlan* given) {
  const std::shared_ptr<void> stream = device_.Enter();
  const c10::InferenceMode inference;
  StepOutput out;
  StepStats& stats = out.stats;
  const int64_t n = model_->config().seq_len();
  std::set<int64_t> cancelled;
  std::vector<std::unique_ptr<Sequence>> admitted, dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled.swap(cancelled_);
    // Cancelled before admission: leave without ever taking a slot.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (cancelled.count((*it)->id)) {
        dropped.push_back(std::move(*it));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : dropped)
    Finish(s.get(), absl::CancelledError("cancelled before it started"), &out);
  // Cancelled while active: leave now, freeing their slots for this step's admissions.
  for (auto it = active_.begin(); it != active_.end();) {
    if (cancelled.count((*it)->id)) {
      Finish(it->get(), absl::CancelledError("cancelled"), &out);
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    AdmissionPlan own;
    if (given == nullptr) {  // whatever fits, the slots just freed included
      AdmissionBudget budget;
      budget.free_slots = free_slots();
      budget.held = HeldSlots();
      own = PlanAdmission(WaitingLocked(), budget);
    }
    const AdmissionPlan& plan = given != nullptr ? *given : own;
    // In the plan's order; a request that left the queue since (cancelled) is passed over.
    for (int64_t id : plan.ids) {
      const auto it = std::find_if(pending_.begin(), pending_.end(),
                                   [id](const auto& s) { return s->id == id; });
      if (it == pending_.end()) continue;
      Sequence& s = **it;
      if (s.request.slots() > free_slots()) break;
      s.slot = *pool_.Reserve();  // free_slots() said there is one
      pool_.Commit(s.slot);
      if (s.request.guided()) {
        s.guide_slot = *pool_.Reserve();
        pool_.Commit(s.guide_slot);
      }
      admitted.push_back(std::move(*it));
      pending_.erase(it);
    }
  }
  const auto prefill_start = std::chrono::steady_clock::now();
  for (auto& s : admitted) {
    ++stats.admitted;
    absl::Status st = Admit(s.get(), &out);
    if (!st.ok()) {
      Finish(s.get(), st, &out);
    } else {
      stats.prefill_tokens += s->request.slots() * s->position;  // the prefixes Admit ran
      active_.push_back(std::move(s));
    }
  }
  const auto decode_start = std::chrono::steady_clock::now();
  stats.prefill_seconds = std::chrono::duration<double>(decode_start - prefill_start).count();
  if (active_.empty()) return out;

  const int64_t batch = static_cast<int64_t>(active_.size());
  stats.sequences = batch;
  const float* lp = nullptr;
  try {
    lp = RunDecodeStep(&stats.batch);
    // Each sequence's draw depends on its own logits (and its guide row's), seed and pixel
    // index only: the draws of a large batch are split over the threads (a few microseconds
    // each), then delivered in order on this thread.
    samples_.resize(static_cast<size_t>(batch));
    at::parallel_for(0, batch, kSamplesPerTask, [&](int64_t i0, int64_t i1) {
      float guided[256];
      for (int64_t i = i0; i < i1; ++i) {
        const Sequence& s = *active_[i];
        const float* logits = lp + i * 256;
        if (guide_rows_[i] >= 0) {
          GuideLogits(logits, lp + guide_rows_[i] * 256, s.request.guidance, guided);
          logits = guided;
        }
        samples_[i] =
            SamplePixel(logits, s.request.sampling, static_cast<uint64_t>(s.pixels.size()));
      }
    });
  } catch (const std::exception& e) {
    const absl::Status st =
        absl::InternalError(absl::StrCat("decode step failed: ", ExceptionMessage(e)));
    for (auto& s : active_) Finish(s.get(), st, &out);
    active_.clear();
    return out;
  }
  std::vector<std::unique_ptr<Sequence>> still;
  still.reserve(active_.size());
  for (int64_t i = 0; i < batch; ++i) {
    Sequence* s = active_[i].get();
    const int64_t index = static_cast<int64_t>(s->pixels.size());
    const uint8_t px = samples_[i];
    s->pixels.push_back(px);
    out.pixels.push_back({s->id, index, px});
    if (static_cast<int64_t>(s->pixels.size()) == n) {
      Finish(s, absl::OkStatus(), &out);
      continue;
    }
    s->position += 1;
    s->input = px;
    still.push_back(std::move(active_[i]));
  }
  active_ = std::move(still);
  stats.decode_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - decode_start).count();
  return out;
}

std::map<int64_t, StepOutput::Finished> RunUntilIdle(DecodeEngine* engine) {
  std::map<int64_t, StepOutput::Finished> done;
  while (engine->Busy()) {
    for (StepOutput::Finished& f : engine->Step().finished) done[f.id] = std::move(f);
  }
  return done;
}

absl::Status ValidateGuidance(double guidance, int64_t label) {
  if (GenerationRequest::SlotsFor(guidance) > 1 && label < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("guidance ", guidance,
                     " needs a class (guidance other than 1 steers the image towards a class; "
                     "without one, leave it at 1)"));
  }
  if (!(guidance >= 0 && guidance <= GenerationRequest::kMaxGuidance)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "guidance must be in [0, ", GenerationRequest::kMaxGuidance, "], got ", guidance));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::vector<double>> ScoreBitsPerDimUnguarded(const PixelModel& model,
                                                             const at::Tensor& images,
                                                             const std::vector<int64_t>& labels,
                                                             KrauseImpl impl,
                                                             const CpuDecoder* packed) {
  const int64_t n = model.config().seq_len();
  if (!images.defined() || images.dim() != 2 || images.size(1) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("images must have shape [B, ", n, "] (", model.config().height, "x",
                     model.config().width_px, "x", model.config().channels, " subpixels)"));
  }
  at::Tensor x = images.to(at::kLong);
  if (x.numel() > 0 && (x.min().item<int64_t>() < 0 || x.max().item<int64_t>() > 255)) {
    return absl::InvalidArgumentError("images: subpixel values must be in [0, 255]");
  }
  at::Tensor classes;
  if (!labels.empty()) {
    if (static_cast<int64_t>(labels.size()) != x.size(0)) {
      return absl::InvalidArgumentError(absl::StrCat("labels: ", labels.size(), " classes for ",
                                                     x.size(0),
                                                     " images (one per image, or none)"));
    }
    std::vector<int64_t> rows;
    for (size_t i = 0; i < labels.size(); ++i) {
      auto row = model.config().ClassRow(labels[i]);
      if (!row.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("labels[", i, "]: ", row.status().message()));
      rows.push_back(*row);
    }
    if (model.config().conditional()) classes = at::tensor(rows, at::kLong);
  }
  if (packed != nullptr && packed->precision() == Precision::kBf16) {
    std::vector<int64_t> class_rows;
    if (classes.defined())
      class_rows.assign(classes.data_ptr<int64_t>(), classes.data_ptr<int64_t>() + classes.numel());
    const at::Tensor flat = x.contiguous();
    return packed->BitsPerDim(flat.data_ptr<int64_t>(), flat.size(0),
                              class_rows.empty() ? nullptr : class_rows.data());
  }
  try {
    const c10::InferenceMode inference;
    const at::Tensor bpd = (model.NllPerImage(x.to(model.device()), impl, classes) / std::log(2.0))
                               .to(at::kCPU)
                               .contiguous();
    return std::vector<double>(bpd.data_ptr<float>(), bpd.data_ptr<float>() + bpd.numel());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("scoring failed: ", ExceptionMessage(e)));
  }
}

}  // namespace

absl::StatusOr<std::vector<double>> ScoreBitsPerDim(const PixelModel& model,
                                                    const at::Tensor& images,
                                                    const std::vector<int64_t>& labels,
                                                    KrauseImpl impl, const CpuDecoder* packed) {
  // The checks before the scoring run LibTorch ops too (conversion, min/max): nothing may throw
  // out of here into the worker thread.
  try {
    return ScoreBitsPerDimUnguarded(model, images, labels, impl, packed);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("scoring failed: ", ExceptionMessage(e)));
  }
}

}  // namespace krause
