// CPU thread setup shared by the trainer, the server, the benchmarks and the tests.
//
// LibTorch parallelises its own kernels over its intra-op pool, and calls the BLAS library for
// every matrix product. Debian's LibTorch uses OpenBLAS (pthreads), which by default starts its
// own thread per core as well: both pools then spin for the same cores, and on the 2-core CI
// machine a training step of the bundled ViT ran 1.8x slower than with single-threaded BLAS
// calls (bench/train_bench.cc measures this side by side).
// SetCpuThreads therefore sets the intra-op pool and makes BLAS calls single-threaded, unless the
// user set OPENBLAS_NUM_THREADS, which is left alone.
// Thread-safety: call once at start-up, before other threads run LibTorch code.
#pragma once

#include <cstdint>

namespace krause {

struct CpuThreads {
  int intra_op = 0;            // LibTorch intra-op threads after the call
  int blas = 0;                // OpenBLAS threads after the call; 0 where OpenBLAS is not loaded
  bool blas_from_env = false;  // OPENBLAS_NUM_THREADS was set and respected
};

// intra_op <= 0 means one thread per core.
CpuThreads SetCpuThreads(int intra_op);

// Sizing parallel work. A fork/join of the intra-op pool costs tens of microseconds when its
// threads sleep (and their spinning takes the cores from the RPC threads), so work is split only
// into tasks of at least kMinTaskFlops.
constexpr double kMinTaskFlops = 1.0e6;
// Memory traffic in the same currency: a weight byte streamed from memory costs a core about as
// long as this many FLOPs (a decode step of one sequence over a large model reads every weight
// once and is bound by memory bandwidth, which two cores draw more of than one).
constexpr double kFlopsPerByte = 4.0;
// The grain for at::parallel_for over items of `flops_per_item` each: ranges of fewer than two
// grains run inline on the calling thread.
int64_t GrainForWork(double flops_per_item, double min_task_flops = kMinTaskFlops);

// A classifier batch (vit_cpu.h) is split over the threads by images, in tasks of at least half
// this many FLOPs: smaller batches run on the batcher's thread, leaving the other cores to the
// RPC threads that meanwhile prepare the next batch's requests.
constexpr double kMinParallelForwardFlops = 256.0e6;

// OpenBLAS's thread count (0 where OpenBLAS is not loaded) and a way to set it (no-op then);
// the benchmark compares both settings.
int BlasThreads();
void SetBlasThreads(int threads);

}  // namespace krause
