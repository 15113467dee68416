/*
 * The training stack's one error convention (as lib/'s xmesh_last_error): a function that fails
 * returns its error code (xmesh_result_t, or -1 where it returns int) after recording one
 * message that names the bad value with xmp_err; the caller reads it with xmp_last_error and,
 * when it passes the failure up, wraps it in its own context (xmp_err("layer %s: %s", name,
 * xmp_last_error()) is safe: the message is formatted before it replaces the old one). One
 * thread-local buffer for every module of pipeline/ (nn/, models/, ckpt/, apps/); no MPI here.
 */
#ifndef XMP_NN_ERROR_H
#define XMP_NN_ERROR_H

#include <xmesh.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Records the message (printf format) as this thread's last error and returns r. */
xmesh_result_t xmp_err(xmesh_result_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The message of this thread's last error ("" before any). */
const char *xmp_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_ERROR_H */
