/*
 * paths.h — internal: which kernel variant each layer's operations ran
 * (DS4PY_PATHS=1). A speed claim is only as good as the gate that chose the
 * kernel: this records, per layer and operation, the variant that actually
 * executed, so a report can show it (ds4_paths_report in ds4.h; the Python
 * front prints it once at exit). Off (one predictable branch) unless the
 * environment variable DS4PY_PATHS is "1" when the core first checks.
 */
#ifndef DS4_PATHS_H
#define DS4_PATHS_H

#include <stdint.h>

/* Layer labels besides trunk layer indices. */
#define DS4_PATH_HEAD (-1)  /* the LM head */
#define DS4_PATH_OTHER (-2) /* outside the trunk loop (nextn / draft heads) */

int ds4_paths_on(void);
/* Record (layer, op, variant) once; op and variant are copied. */
void ds4_path_note(int64_t layer, const char *op, const char *variant);

#endif
