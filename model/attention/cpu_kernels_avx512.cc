// The fused CPU kernels compiled with AVX-512 (F, VL, BW, DQ) besides AVX2 and FMA (x86-64 only;
// CMake adds the flags). Chosen at run time only on CPUs that have them all. Its linear kernel
// works in 512-bit registers (cpu_kernels.inc, LinearTile); every kernel gives the bits of the
// avx2 variant (the same operations in the same order, each multiply-add fused in both).
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define KRAUSE_CPU_ISA avx512
#define KRAUSE_CPU_ISA_NAME "avx512"
#include "model/attention/cpu_kernels.inc"
#endif
