#include "model/nn/dnnl_linear.h"

#include <ATen/ATen.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#if defined(KRAUSE_HAVE_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
#endif
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/attention/cpu_kernels.h"

namespace krause::nn {
namespace {

uint16_t OneToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return nan ? uint16_t{0x7fc0} : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__x86_64__)
typedef uint32_t U32x16 __attribute__((vector_size(64), aligned(4)));
typedef uint16_t U16x16 __attribute__((vector_size(32), aligned(2)));
// OneToBf16 sixteen at a time (the bf16 path runs on AVX-512 CPUs only).
__attribute__((target("avx512f,avx512bw"))) void ToBf16Avx512(const float* x, int64_t n,
                                                              uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const U32x16 u = *reinterpret_cast<const U32x16*>(x + i);
    const U32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const U32x16 r = (u & 0x7fffffffu) > 0x7f800000u ? U32x16{} + 0x7fc0u : rounded;
    *reinterpret_cast<U16x16*>(out + i) = __builtin_convertvector(r, U16x16);
  }
  for (; i < n; ++i) out[i] = OneToBf16(x[i]);
}
#endif

}  // namespace

void ToBf16(const float* x, int64_t n, uint16_t* out) {
#if defined(__x86_64__)
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  if (avx512) return ToBf16Avx512(x, n, out);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = OneToBf16(x[i]);
}

#if defined(KRAUSE_HAVE_DNNL)
namespace {

using dnnl::memory;
using Dt = dnnl::memory::data_type;

dnnl::engine& Engine() {
  static dnnl::engine* const engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// The calling thread's oneDNN calls run on one thread (OpenMP's nthreads ICV is per thread):
// oneDNN plans a primitive for the threads it sees at creation and splits it over those it sees
// at execution, and a split of a sum (over K) could change its bits. Restored on exit.
class OneThread {
 public:
  OneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

const char* IsaName(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

// Per-thread scratch for the primitives (scratchpad_mode::user) and the thread's stream.
struct ThreadState {
  std::vector<char> scratch;
  dnnl::stream stream{Engine()};
  char* Scratch(size_t bytes) {
    if (scratch.size() < bytes) scratch.resize(bytes);
    return scratch.data();
  }
};
ThreadState& State() {
  thread_local ThreadState s;
  return s;
}

}  // namespace

struct Bf16Linear::Impl {
  int64_t in = 0, out = 0, rows = 0, out_stride = 0;
  int64_t block_rows = 0, blocks = 0;  // row blocks of block_rows rows, the last maybe fewer
  // The full blocks' primitive and, for a shorter last block, its own.
  struct Kind {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
    memory::desc src, dst, scratch;
  };
  Kind full, last;
  memory weights, bias;
  int64_t bytes = 0;

  int64_t RowsOf(int64_t block) const { return std::min(block_rows, rows - block * block_rows); }
  const Kind& KindOf(int64_t block) const { return RowsOf(block) == block_rows ? full : last; }
  Kind MakeKind(int64_t m) const {
    Kind k;
    k.src = memory::desc({m, in}, Dt::bf16, memory::dims{in, 1});
    const memory::desc w({in, out}, Dt::bf16, memory::format_tag::any);
    const memory::desc b({1, out}, Dt::f32, memory::dims{out, 1});
    k.dst = memory::desc({m, out}, Dt::f32, memory::dims{out_stride, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    k.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(k.src, w, b, k.dst), attr, Engine());
    k.scratch = k.pd.scratchpad_desc();
    k.prim = dnnl::matmul(k.pd);
    return k;
  }
};

const Bf16MatmulInfo& Bf16MatmulSupport() {
  static const Bf16MatmulInfo info = [] {
    Bf16MatmulInfo i;
    try {
      const OneThread one;
      i.isa = IsaName(dnnl::get_effective_cpu_isa());
      const memory::desc src({16, 64}, Dt::bf16, memory::dims{64, 1});
      const memory::desc w({64, 64}, Dt::bf16, memory::format_tag::any);
      const memory::desc b({1, 64}, Dt::f32, memory::dims{64, 1});
      const memory::desc dst({16, 64}, Dt::f32, memory::dims{64, 1});
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, w, b, dst), Engine());
      i.impl = pd.impl_info_str();
      // Only AMX is worth it: oneDNN runs bf16 on plain AVX-512 by emulation, has no bf16
      // matmul below it, and its AVX512-BF16 kernels (the same CPU capped with
      // ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16) served a ViT-S/16 slower than the fp32 kernels
      // (docs/benchmarks.md): a bf16 model there would lose accuracy and speed both.
      i.available = dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
      if (!i.available) {
        i.why = absl::StrCat("oneDNN's bf16 GEMMs are used with AMX only (this CPU, as oneDNN ",
                             "sees it: ", i.isa, "; without AMX they ran slower than the fp32 ",
                             "kernels)");
      }
    } catch (const std::exception& e) {
      i.available = false;
      i.why = absl::StrCat("oneDNN has no bfloat16 matmul on this CPU (", i.isa, "): ", e.what());
    }
    return i;
  }();
  return info;
}

absl::StatusOr<Bf16Linear> Bf16Linear::Create(const float* weight, const float* bias, int64_t out,
                                              int64_t in, int64_t rows, int64_t out_stride) {
  if (out < 1 || in < 1 || rows < 1 || out_stride < out) {
    return absl::InvalidArgumentError(absl::StrCat("bf16 linear: bad sizes out ", out, ", in ", in,
                                                   ", rows ", rows, ", stride ", out_stride));
  }
  if (!Bf16MatmulSupport().available) return absl::FailedPreconditionError(Bf16MatmulSupport().why);
  auto impl = std::make_unique<Impl>();
  try {
    const OneThread one;
    impl->in = in;
    impl->out = out;
    impl->rows = rows;
    impl->out_stride = out_stride;
    // As few blocks as kBf16BlockRows allows, as equal as whole 16-row tiles make them.
    const int64_t count = (rows + kBf16BlockRows - 1) / kBf16BlockRows;
    impl->block_rows = std::min(rows, ((rows + count - 1) / count + 15) / 16 * 16);
    impl->blocks = (rows + impl->block_rows - 1) / impl->block_rows;
    impl->full = impl->MakeKind(impl->block_rows);
    const int64_t last_rows = impl->RowsOf(impl->blocks - 1);
    if (last_rows != impl->block_rows) impl->last = impl->MakeKind(last_rows);
    dnnl::stream stream(Engine());
    // W [out, in] seen as the [in, out] matrix W^T (strides 1, in), fp32; the reorder rounds to
    // bfloat16 (nearest even) into the primitive's layout (every block's is the same).
    const memory::desc plain({in, out}, Dt::f32, memory::dims{1, in});
    memory src(plain, Engine(), const_cast<float*>(weight));
    impl->weights = memory(impl->full.pd.weights_desc(), Engine());
    dnnl::reorder(src, impl->weights).execute(stream, src, impl->weights);
    impl->bias = memory(memory::desc({1, out}, Dt::f32, memory::dims{out, 1}), Engine());
    std::memcpy(impl->bias.get_data_handle(), bias, out * sizeof(float));
    stream.wait();
    if (impl->last.prim && impl->last.pd.weights_desc() != impl->full.pd.weights_desc()) {
      return absl::InternalError("bf16 linear (oneDNN): the row blocks want different layouts");
    }
    impl->bytes = static_cast<int64_t>(impl->weights.get_desc().get_size() + out * sizeof(float));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("bf16 linear (oneDNN): ", e.what()));
  }
  Bf16Linear l;
  l.impl_ = std::move(impl);
  return l;
}

int64_t Bf16Linear::blocks() const { return impl_->blocks; }
int64_t Bf16Linear::block_rows() const { return impl_->block_rows; }
int64_t Bf16Linear::in() const { return impl_->in; }
int64_t Bf16Linear::out() const { return impl_->out; }
int64_t Bf16Linear::rows() const { return impl_->rows; }
int64_t Bf16Linear::bytes() const { return impl_->bytes; }

void Bf16Linear::Apply(const uint16_t* x, float* out, int64_t b0, int64_t b1) const {
  const OneThread one;
  ThreadState& state = State();
  for (int64_t b = b0; b < b1; ++b) {
    const Impl::Kind& k = impl_->KindOf(b);
    const int64_t r0 = b * impl_->block_rows;
    memory src(k.src, Engine(), const_cast<uint16_t*>(x + r0 * impl_->in));
    memory dst(k.dst, Engine(), out + r0 * impl_->out_stride);
    memory scratch(k.scratch, Engine(), state.Scratch(k.scratch.get_size()));
    k.prim.execute(state.stream, {{DNNL_ARG_SRC, src},
                                  {DNNL_ARG_WEIGHTS, impl_->weights},
                                  {DNNL_ARG_BIAS, impl_->bias},
                                  {DNNL_ARG_DST, dst},
                                  {DNNL_ARG_SCRATCHPAD, scratch}});
  }
  state.stream.wait();
}

#else  // !KRAUSE_HAVE_DNNL: built without oneDNN; bf16 falls back to fp32.

const Bf16MatmulInfo& Bf16MatmulSupport() {
  static const Bf16MatmulInfo info{false, "", "",
                                   "this build has no oneDNN (KRAUSE_WITH_DNNL=OFF)"};
  return info;
}

struct Bf16Linear::Impl {};
absl::StatusOr<Bf16Linear> Bf16Linear::Create(const float*, const float*, int64_t, int64_t, int64_t,
                                              int64_t) {
  return absl::FailedPreconditionError(Bf16MatmulSupport().why);
}
int64_t Bf16Linear::blocks() const { return 0; }
int64_t Bf16Linear::block_rows() const { return 0; }
int64_t Bf16Linear::in() const { return 0; }
int64_t Bf16Linear::out() const { return 0; }
int64_t Bf16Linear::rows() const { return 0; }
int64_t Bf16Linear::bytes() const { return 0; }
void Bf16Linear::Apply(const uint16_t*, float*, int64_t, int64_t) const {}

#endif  // KRAUSE_HAVE_DNNL

Precision EffectivePrecision(Precision asked, std::string* why) {
  if (asked != Precision::kBf16 || Bf16MatmulSupport().available) return asked;
  *why = Bf16MatmulSupport().why;
  return Precision::kFp32;
}

std::string LinearKernelsName(Precision precision) {
  if (precision == Precision::kBf16) return "onednn " + Bf16MatmulSupport().impl;
  return cpu::CpuKernels().name;
}

absl::StatusOr<Bf16Linear> Bf16LinearOf(const ParameterStore& p,
                                        const std::vector<std::string>& prefixes, int64_t rows) {
  std::vector<at::Tensor> w, b;
  for (const std::string& name : prefixes) {
    w.push_back(p.Get(name + ".weight").detach().to(at::kCPU, at::kFloat));
    b.push_back(p.Get(name + ".bias").detach().to(at::kCPU, at::kFloat));
  }
  const at::Tensor weight = at::cat(w, 0).contiguous(), bias = at::cat(b, 0).contiguous();
  return Bf16Linear::Create(weight.data_ptr<float>(), bias.data_ptr<float>(), weight.size(0),
                            weight.size(1), rows, cpu::RoundUpToChunk(weight.size(0)));
}

// Defined once Impl is complete (either kind).
Bf16Linear::Bf16Linear() = default;
Bf16Linear::~Bf16Linear() = default;
Bf16Linear::Bf16Linear(Bf16Linear&&) noexcept = default;
Bf16Linear& Bf16Linear::operator=(Bf16Linear&&) noexcept = default;

}  // namespace krause::nn
