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

namespace krause {

struct CpuThreads {
  int intra_op = 0;            // LibTorch intra-op threads after the call
  int blas = 0;                // OpenBLAS threads after the call; 0 where OpenBLAS is not loaded
  bool blas_from_env = false;  // OPENBLAS_NUM_THREADS was set and respected
};

// intra_op <= 0 means one thread per core.
CpuThreads SetCpuThreads(int intra_op);

// OpenBLAS's thread count (0 where OpenBLAS is not loaded) and a way to set it (no-op then);
// the benchmark compares both settings.
int BlasThreads();
void SetBlasThreads(int threads);

}  // namespace krause
