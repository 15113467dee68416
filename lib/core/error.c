/* Result strings, the thread-local last error and XMESH_DEBUG logging. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "xm_core.h"

static _Thread_local char last_error[1024];

const char *xmesh_result_string(xmesh_result_t r)
{
    switch (r) {
#define XM_RESULT_CASE_(name, value, text)                                                         \
    case name:                                                                                     \
        return text;
        XMESH_RESULT_LIST(XM_RESULT_CASE_)
#undef XM_RESULT_CASE_
    }
    return "unknown result";
}

const char *xmesh_last_error(void)
{
    return last_error;
}

char *xm_error_buffer(void)
{
    return last_error;
}

void xm_error_clear(void)
{
    last_error[0] = '\0';
}

/* The message is formatted into a temporary first: an argument may point into
 * last_error itself (XM_ERR(r, "context: %s", xmesh_last_error()) wraps the
 * previous message), and vsnprintf's source and destination must not overlap. */
xmesh_result_t xm_error_at(const char *file, int line, xmesh_result_t r, const char *fmt, ...)
{
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, strlen(msg) + 1);
    XM_LOG(XM_LOG_INFO, "%s:%d error %d (%s): %s", file, line, (int)r, xmesh_result_string(r),
           last_error);
    return r;
}

int xm_log_level(void)
{
    static int level = -1;
    if (level < 0) {
        /* Declared in param.c's table, but read here directly: the table's own parsing
         * reports through XM_ERR and logging, which would come back here. */
        const char *s = getenv("XMESH_DEBUG");
        int l = XM_LOG_NONE;
        if (s && !strcasecmp(s, "WARN"))
            l = XM_LOG_WARN;
        else if (s && !strcasecmp(s, "INFO"))
            l = XM_LOG_INFO;
        else if (s && !strcasecmp(s, "TRACE"))
            l = XM_LOG_TRACE;
        else if (s && *s)
            fprintf(stderr,
                    "xmesh WARN XMESH_DEBUG=%s refused: expected WARN, INFO or TRACE; using the "
                    "default (errors are only recorded)\n",
                    s);
        level = l;
    }
    return level;
}

void xm_log_at(int level, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"", "WARN", "INFO", "TRACE"};
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    fprintf(stderr, "xmesh %s %s:%d %s\n", names[level], base ? base + 1 : file, line, msg);
}
