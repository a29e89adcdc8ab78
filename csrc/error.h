/* error.h — internal: filling a ds4_error. */
#ifndef DS4_ERROR_H
#define DS4_ERROR_H

#include "ds4.h"

/* Format a message into err (which may be NULL) and return code, so callers
 * write `return ds4_fail(err, DS4_ERR_ARG, "n=%lld ...", n);`. */
int ds4_fail(ds4_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reset err to DS4_OK with an empty message; returns DS4_OK. */
int ds4_ok(ds4_error *err);

#endif
