// Linear layers in bfloat16 through oneDNN (Debian's libdnnl, the library LibTorch itself uses on
// the CPU), for the "bf16" precision (docs/precision.md): weights rounded to bfloat16 once and
// reordered into the layout oneDNN's matmul wants on this CPU (AMX tiles, AVX512-BF16 or what it
// has), activations rounded to bfloat16 per call, products accumulated in fp32, fp32 out.
//
// Determinism: a row's result must not depend on the rows beside it (batch invariance), the
// thread split or the call. So every layer has a FIXED row count (the rows of each call, e.g. a
// ViT's tokens per image), cut into FIXED row blocks (at most kBf16BlockRows rows each, as equal
// as 16-row tiles allow: a ViT-S/16's 197 tokens are 112 + 85); each block size is one
// primitive, made once at Create, and every call runs it with one oneDNN thread (the caller
// splits blocks or images over its threads). oneDNN then plans and sums each row the same way on
// every call: equal inputs give equal bits on a given CPU and oneDNN version. Different CPUs may
// pick different kernels (Bf16MatmulSupport().impl names the one in use), whose sums can differ
// in the last bits.
//
// Speed: a block computes every output column at once, into rows `out_stride` apart; with
// out_stride == out the destination is dense, which oneDNN's AMX kernels need to run at full
// speed (a strided destination measured 4x slower here).
//
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/nn/parameters.h"
#include "model/precision.h"

namespace krause::nn {

// Rows per block at most: each block is one matmul call and one unit of thread work.
constexpr int64_t kBf16BlockRows = 128;

// Whether this CPU runs oneDNN's bfloat16 matmul where it pays: with AMX (oneDNN's effective ISA
// avx512_core_amx; ONEDNN_MAX_CPU_ISA can cap it), probed once (a small primitive is made).
struct Bf16MatmulInfo {
  bool available = false;
  std::string isa;   // oneDNN's effective ISA, e.g. "avx512_core_amx"
  std::string impl;  // the matmul kernel oneDNN picked, e.g. "brg:avx512_core_amx"
  std::string why;   // !available: the reason ("oneDNN has no bf16 matmul on avx2")
};
const Bf16MatmulInfo& Bf16MatmulSupport();

// The precision a model asked for `asked` runs here: bf16 only where Bf16MatmulSupport() is
// available, else fp32 with *why set to the reason (*why is left alone otherwise).
Precision EffectivePrecision(Precision asked, std::string* why);
// What computes the linear layers in `precision`: "onednn " and oneDNN's matmul kernel for bf16
// ("onednn brg:avx512_core_amx_bf16"), else the CPU kernels' variant ("avx512").
std::string LinearKernelsName(Precision precision);

// x -> bfloat16 bits, nearest even (LibTorch's rounding; a NaN stays a NaN).
void ToBf16(const float* x, int64_t n, uint16_t* out);

class Bf16Linear {
 public:
  // weight [out, in] and bias [out] as fp32 row-major; `rows`: the row count of every call;
  // out_stride (>= out): the distance between output rows. FailedPrecondition where this CPU
  // has no bf16 matmul (Bf16MatmulSupport), InvalidArgument for bad sizes.
  static absl::StatusOr<Bf16Linear> Create(const float* weight, const float* bias, int64_t out,
                                           int64_t in, int64_t rows, int64_t out_stride);
  Bf16Linear();
  ~Bf16Linear();
  Bf16Linear(Bf16Linear&&) noexcept;
  Bf16Linear& operator=(Bf16Linear&&) noexcept;

  int64_t blocks() const;
  int64_t block_rows() const;  // rows of every block but maybe the last
  int64_t in() const;
  int64_t out() const;
  int64_t rows() const;
  // The bytes the weights (bfloat16, oneDNN's layout) and biases take.
  int64_t bytes() const;
  // out[r * out_stride + j] = bias[j] + sum_k x[r, k] W[j, k], j < out, r in the rows of row
  // blocks [b0, b1); x: [rows, in] bfloat16 bits (ToBf16). Runs on the calling thread.
  void Apply(const uint16_t* x, float* out, int64_t b0, int64_t b1) const;
  void Apply(const uint16_t* x, float* out) const { Apply(x, out, 0, blocks()); }

 private:
  struct Impl;
  std::unique_ptr<const Impl> impl_;
};

// The layers `prefixes` of a store (`name.weight` [out, in], `name.bias` [out]), stacked along
// their outputs (q, k, v -> one matrix), as a bf16 linear layer over `rows` rows whose output rows
// are cpu::RoundUpToChunk(out) apart (the packed layers' layout, nn/packed.h).
absl::StatusOr<Bf16Linear> Bf16LinearOf(const ParameterStore& p,
                                        const std::vector<std::string>& prefixes, int64_t rows);

}  // namespace krause::nn
