// The fused CPU kernels compiled for the compiler's default ISA (runs on any CPU).
#define KRAUSE_CPU_ISA base
#define KRAUSE_CPU_ISA_NAME "base"
#include "model/attention/cpu_kernels.inc"
