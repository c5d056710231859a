// The fused CPU kernels compiled with AVX2 and FMA (x86-64 only; CMake adds -mavx2 -mfma).
// Chosen at run time only on CPUs that have both.
#if defined(__AVX2__) && defined(__FMA__)
#define KRAUSE_CPU_ISA avx2
#define KRAUSE_CPU_ISA_NAME "avx2"
#include "model/attention/cpu_kernels.inc"
#endif
