#include "error.h"

#include <stdarg.h>
#include <stdio.h>

int ds4_fail(ds4_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int ds4_ok(ds4_error *err) {
    if (err) {
        err->code = DS4_OK;
        err->message[0] = '\0';
    }
    return DS4_OK;
}
