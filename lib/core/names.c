/* Names of dtypes, strategies and schedulers, and their parsers. */
#include <string.h>

#include "xm_core.h"

static const struct {
    const char *name, *alias;
    size_t size;
} dtypes[XMESH_DTYPE_COUNT_] = {
    [XMESH_U8] = {"u8", "uint8", 1},     [XMESH_I8] = {"i8", "int8", 1},
    [XMESH_I32] = {"i32", "int32", 4},   [XMESH_I64] = {"i64", "int64", 8},
    [XMESH_F16] = {"f16", "float16", 2}, [XMESH_BF16] = {"bf16", "bfloat16", 2},
    [XMESH_F32] = {"f32", "float32", 4}, [XMESH_F64] = {"f64", "float64", 8},
};

size_t xmesh_dtype_size(xmesh_dtype_t t)
{
    return (unsigned)t < XMESH_DTYPE_COUNT_ ? dtypes[t].size : 0;
}

const char *xmesh_dtype_name(xmesh_dtype_t t)
{
    return (unsigned)t < XMESH_DTYPE_COUNT_ ? dtypes[t].name : NULL;
}

xmesh_result_t xmesh_dtype_parse(const char *name, xmesh_dtype_t *out)
{
    if (!name || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_dtype_parse: %s is NULL",
                      !name ? "name" : "out");
    for (int i = 0; i < XMESH_DTYPE_COUNT_; i++)
        if (!strcmp(name, dtypes[i].name) || !strcmp(name, dtypes[i].alias)) {
            *out = (xmesh_dtype_t)i;
            return XMESH_SUCCESS;
        }
    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                  "unknown dtype '%s' (expected u8, i8, i32, i64, f16, bf16, f32 or f64)", name);
}

static const char *strategies[XMESH_STRATEGY_COUNT_] = {"broadcast", "sendrecv",
                                                        "sendrecv-allgather", "global-allgather"};
static const char *schedulers[XMESH_SCHEDULER_COUNT_] = {"naive", "lb", "dfs", "greedy",
                                                         "ensemble"};

const char *xmesh_strategy_name(xmesh_strategy_t s)
{
    return (unsigned)s < XMESH_STRATEGY_COUNT_ ? strategies[s] : "unset";
}

const char *xmesh_scheduler_name(xmesh_scheduler_t s)
{
    return (unsigned)s < XMESH_SCHEDULER_COUNT_ ? schedulers[s] : "unset";
}

static int find_name(const char *name, const char *const *table, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(name, table[i]))
            return i;
    return -1;
}

xmesh_result_t xmesh_strategy_parse(const char *name, xmesh_strategy_t *out)
{
    int i = name ? find_name(name, strategies, XMESH_STRATEGY_COUNT_) : -1;
    if (i < 0 || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "unknown strategy '%s' (expected broadcast, sendrecv, sendrecv-allgather "
                      "or global-allgather)",
                      name ? name : "(null)");
    *out = (xmesh_strategy_t)i;
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_scheduler_parse(const char *name, xmesh_scheduler_t *out)
{
    int i = name ? find_name(name, schedulers, XMESH_SCHEDULER_COUNT_) : -1;
    if (i < 0 || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "unknown scheduler '%s' (expected naive, lb, dfs, greedy or ensemble)",
                      name ? name : "(null)");
    *out = (xmesh_scheduler_t)i;
    return XMESH_SUCCESS;
}

const char *xmesh_version_string(void)
{
    return XMESH_VERSION_STRING;
}

uint64_t xm_hash64(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}
