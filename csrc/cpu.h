#ifndef DS4_CPU_H
#define DS4_CPU_H
/* 1 when DS4_FORCE_SCALAR is set to anything but "" or "0". */
int ds4_force_scalar(void);
/* ISAs the CPU and OS grant (bit i for DS4_ISA i), whether or not kernels
 * for them were compiled in; ds4_isa_available() also requires the latter. */
int ds4_cpu_isa_mask(void);
#endif
