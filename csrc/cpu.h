#ifndef DS4_CPU_H
#define DS4_CPU_H
/* 1 when DS4_FORCE_SCALAR is set to anything but "" or "0". */
int ds4_force_scalar(void);
#endif
