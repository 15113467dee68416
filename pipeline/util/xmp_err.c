/* The caller-buffer error formatter (util/xmp_err.h). */
#include "util/xmp_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void xmp_verr_buf(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (!err || !errlen)
        return;
    /* formatted aside first: an argument may point into err */
    char small[1024], *tmp = errlen <= sizeof small ? small : malloc(errlen);
    if (!tmp) { /* no room to format aside: the arguments are then trusted not to overlap */
        vsnprintf(err, errlen, fmt, ap);
        return;
    }
    vsnprintf(tmp, errlen, fmt, ap);
    memcpy(err, tmp, strlen(tmp) + 1);
    if (tmp != small)
        free(tmp);
}

int xmp_err_buf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    xmp_verr_buf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}
