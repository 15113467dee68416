/*
 * The caller-buffer form of the training stack's error convention (nn/error.h): modules whose
 * functions hand a message back through (char *err, size_t errlen) (sched/, search/, the
 * strategy and stage-layout parsers, the SBP rules, the driver) fail with
 *
 *     return xmp_err_buf(err, errlen, "stage %d: %s", s, why);   (returns -1)
 *
 * One formatter for all of them, so a message reads the same whichever module wrote it. The
 * message is formatted before it replaces err's contents, so an argument may point into err
 * (xmp_err_buf(err, errlen, "layer %d: %s", l, err) wraps the previous message); otherwise the
 * result is exactly vsnprintf(err, errlen, fmt, ...): cut at errlen - 1 bytes, NUL-terminated.
 * err == NULL or errlen == 0: nothing is written. No MPI, no allocation that outlives the call.
 */
#ifndef XMP_UTIL_XMP_ERR_H
#define XMP_UTIL_XMP_ERR_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Formats the message into err[0..errlen-1] and returns -1. */
int xmp_err_buf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same from a va_list, for wrappers that return something else (a result code). */
void xmp_verr_buf(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

#ifdef __cplusplus
}
#endif
#endif /* XMP_UTIL_XMP_ERR_H */
