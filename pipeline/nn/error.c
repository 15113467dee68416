/* The training stack's error message (nn/error.h). */
#include "nn/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char xmp_err_buf[512];

const char *xmp_last_error(void)
{
    return xmp_err_buf;
}

xmesh_result_t xmp_err(xmesh_result_t r, const char *fmt, ...)
{
    char tmp[sizeof xmp_err_buf]; /* the arguments may point into xmp_err_buf */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(xmp_err_buf, tmp, sizeof tmp);
    return r;
}
