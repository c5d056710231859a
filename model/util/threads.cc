#include "model/util/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

namespace krause {

namespace {

// OpenBLAS is reached through LibTorch's libblas.so.3, so look its controls up at run time; the
// project does not link a particular BLAS itself.
using SetFn = void (*)(int);
using GetFn = int (*)();

SetFn BlasSetter() { return reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")); }
GetFn BlasGetter() { return reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads")); }

}  // namespace

int BlasThreads() {
  const GetFn get = BlasGetter();
  return get != nullptr ? get() : 0;
}

void SetBlasThreads(int threads) {
  const SetFn set = BlasSetter();
  if (set != nullptr) set(std::max(1, threads));
}

CpuThreads SetCpuThreads(int intra_op) {
  if (intra_op <= 0) intra_op = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(intra_op);
  CpuThreads t;
  t.blas_from_env = std::getenv("OPENBLAS_NUM_THREADS") != nullptr;
  if (!t.blas_from_env) SetBlasThreads(1);
  t.intra_op = at::get_num_threads();
  t.blas = BlasThreads();
  return t;
}

int64_t GrainForWork(double flops_per_item, double min_task_flops) {
  if (!(flops_per_item > 0)) return 1;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(min_task_flops / flops_per_item)));
}

}  // namespace krause
