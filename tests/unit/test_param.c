/* Parameters: byte sizes with binary suffixes, refused garbage (warning,
 * default kept), the typed accessors' cache, and the misspelt-variable
 * check. Runs in one process; changes its own environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "xm_core.h"

static void test_parse_int(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int bytes;
        int ok;
        int64_t want;
    } cases[] = {
        {"262144", 1, 1, 262144},
        {"256K", 1, 1, 262144},
        {"256k", 1, 1, 262144},
        {"256KiB", 1, 1, 262144},
        {"4M", 1, 1, 4 << 20},
        {"2G", 1, 1, (int64_t)2 << 30},
        {"8589934591G", 1, 1, (int64_t)8589934591 << 30},
        {"8589934592G", 1, 0, 0}, /* 2^63: does not fit */
        {"256K", 0, 0, 0},        /* a plain integer takes no suffix */
        {"256X", 1, 0, 0},
        {"256KB", 1, 0, 0},
        {"0x10", 0, 0, 0}, /* decimal only: no silent hex/octal */
        {"12abc", 0, 0, 0},
        {"abc", 0, 0, 0},
        {"", 0, 0, 0},
        {"-5", 0, 1, -5},
        {"99999999999999999999", 0, 0, 0},
        {"9223372036854775807", 0, 1, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t v = 777;
        xmesh_result_t r = xm_param_parse_int(cases[i].s, cases[i].bytes, &v);
        if ((r == XMESH_SUCCESS) != cases[i].ok)
            fail_msg("'%s' (bytes %d): %s, want %s", cases[i].s, cases[i].bytes,
                     xmesh_result_string(r), cases[i].ok ? "success" : "refusal");
        if (cases[i].ok)
            assert_int_equal(v, cases[i].want);
        else {
            assert_int_equal(v, 777); /* untouched */
            assert_non_null(strstr(xmesh_last_error(), cases[i].s));
        }
    }
}

/* Every typed accessor returns its table default when unset, and the table
 * default parses (a broken default would silently be 0). */
static void capture_stderr(void (*f)(void), char *buf, size_t len);
static int64_t g_wait_backoff;
static void read_wait_backoff(void)
{
    g_wait_backoff = xm_param_i64("XMESH_WAIT_BACKOFF_US");
}

static void test_defaults(void **state)
{
    (void)state;
    for (int i = 0; i < xm_param_count(); i++)
        unsetenv(xm_param_get(i)->name);
    xm_param_reset();
    /* 0 = auto, resolved by XMESH_SYNC_SEND (default 1): synchronous chunks
     * just below Open MPI's TCP eager limit, 4 in flight on every link ... */
    assert_int_equal(xm_param_sync_send(), 1);
    assert_int_equal(xm_param_chunk_bytes(), XM_SYNC_CHUNK_BYTES);
    assert_int_equal(XM_SYNC_CHUNK_BYTES, 65408);
    assert_int_equal(xm_param_send_ahead(), 4);
    assert_int_equal(xm_param_forward_ahead(), 4);
    assert_int_equal(xm_param_chunk_bytes_for(0), 262144); /* not the MPI executor */
    /* ... and rendezvous chunks of 256 KiB, 2 in flight at a chain's head and
     * 1 on its forwarders, without */
    setenv("XMESH_SYNC_SEND", "0", 1);
    xm_param_reset();
    assert_int_equal(xm_param_chunk_bytes(), 262144);
    assert_int_equal(xm_param_send_ahead(), 2);
    assert_int_equal(xm_param_forward_ahead(), 1);
    assert_int_equal(xm_param_chunk_bytes_for(0), 262144);
    /* a value set wins over auto */
    setenv("XMESH_SYNC_SEND", "1", 1);
    setenv("XMESH_CHUNK_BYTES", "128K", 1);
    setenv("XMESH_SEND_AHEAD", "3", 1);
    xm_param_reset();
    assert_int_equal(xm_param_chunk_bytes(), 131072);
    assert_int_equal(xm_param_chunk_bytes_for(0), 131072);
    assert_int_equal(xm_param_send_ahead(), 3);
    assert_int_equal(xm_param_forward_ahead(), 4);
    unsetenv("XMESH_SYNC_SEND");
    unsetenv("XMESH_CHUNK_BYTES");
    unsetenv("XMESH_SEND_AHEAD");
    xm_param_reset();
    assert_int_equal(xm_param_budget_us(), 20000);
    assert_int_equal(xm_param_seed(), 1);
    assert_true(xm_param_timeout_s() == 300);
    assert_true(xm_param_nic_gbps() == 10);
    assert_int_equal(xm_param_nics_per_host(), 1);
    assert_true(xm_param_intra_gbps() == 800);
    assert_true(xm_param_latency_us() == 5);
    assert_int_equal(xm_param_nccl_max_comms(), 8);
    assert_int_equal(xm_param_i64("XMESH_WAIT_BACKOFF_US"), 200);
    setenv("XMESH_WAIT_BACKOFF_US", "0", 1); /* out of range [1, 1000000]: the default */
    xm_param_reset();
    char err[512];
    capture_stderr(read_wait_backoff, err, sizeof err);
    assert_non_null(strstr(err, "XMESH_WAIT_BACKOFF_US=0 refused"));
    assert_int_equal(g_wait_backoff, 200);
    setenv("XMESH_WAIT_BACKOFF_US", "50", 1);
    xm_param_reset();
    assert_int_equal(xm_param_i64("XMESH_WAIT_BACKOFF_US"), 50);
    unsetenv("XMESH_WAIT_BACKOFF_US");
    xm_param_reset();
    assert_string_equal(xm_param_strategy(), "broadcast");
    assert_string_equal(xm_param_scheduler(), "ensemble");
    assert_string_equal(xm_param_cluster_file(), "");
    assert_string_equal(xm_param_topo_xml(), "");
    for (int i = 0; i < xm_param_count(); i++) {
        const xm_param_desc_t *p = xm_param_get(i);
        const char *k = xm_param_kind_name(p->name);
        if (!strcmp(k, "string") || !*p->deflt)
            continue;
        int64_t v;
        if (strcmp(k, "real") && xm_param_parse_int(p->deflt, !strcmp(k, "bytes"), &v))
            fail_msg("default of %s '%s' does not parse: %s", p->name, p->deflt,
                     xmesh_last_error());
    }
}

/* Runs f with stderr captured into buf. */
static void capture_stderr(void (*f)(void), char *buf, size_t len)
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    f();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, len - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
}

static int64_t got_i;
static double got_r;
static void read_chunk(void)
{
    got_i = xm_param_chunk_bytes();
}
static void read_nic(void)
{
    got_r = xm_param_nic_gbps();
}

static void test_typed_values(void **state)
{
    (void)state;
    char err[4096];
    setenv("XMESH_CHUNK_BYTES", "256K", 1);
    xm_param_reset();
    capture_stderr(read_chunk, err, sizeof err);
    assert_int_equal(got_i, 262144); /* never 256 */
    assert_null(strstr(err, "WARN"));
    assert_int_equal(xm_param_is_set("XMESH_CHUNK_BYTES"), 1);

    /* cached: a later change of the environment is not seen ... */
    setenv("XMESH_CHUNK_BYTES", "1M", 1);
    assert_int_equal(xm_param_chunk_bytes(), 262144);
    /* ... but the by-name lookup re-reads it */
    assert_int_equal(xm_param_i64("XMESH_CHUNK_BYTES"), 1 << 20);

    setenv("XMESH_CHUNK_BYTES", "256X", 1);
    xm_param_reset();
    capture_stderr(read_chunk, err, sizeof err);
    assert_int_equal(got_i, XM_SYNC_CHUNK_BYTES); /* the default: 0 = auto */
    assert_non_null(strstr(err, "XMESH_CHUNK_BYTES=256X refused"));
    assert_non_null(strstr(err, "using the default 0"));
    /* warned once: the cached value does not warn again */
    capture_stderr(read_chunk, err, sizeof err);
    assert_null(strstr(err, "refused"));

    setenv("XMESH_CHUNK_BYTES", "-1", 1);
    xm_param_reset();
    capture_stderr(read_chunk, err, sizeof err);
    assert_int_equal(got_i, XM_SYNC_CHUNK_BYTES);
    assert_non_null(strstr(err, "XMESH_CHUNK_BYTES=-1 refused"));
    unsetenv("XMESH_CHUNK_BYTES");

    setenv("XMESH_NIC_GBPS", "fast", 1);
    xm_param_reset();
    capture_stderr(read_nic, err, sizeof err);
    assert_true(got_r == 10);
    assert_non_null(strstr(err, "XMESH_NIC_GBPS=fast refused"));
    setenv("XMESH_NIC_GBPS", "-1", 1);
    xm_param_reset();
    capture_stderr(read_nic, err, sizeof err);
    assert_true(got_r == 10);
    assert_non_null(strstr(err, "must be > 0"));
    setenv("XMESH_NIC_GBPS", "2.5", 1);
    xm_param_reset();
    capture_stderr(read_nic, err, sizeof err);
    assert_true(got_r == 2.5);
    assert_null(strstr(err, "WARN"));
    unsetenv("XMESH_NIC_GBPS");
    xm_param_reset();
}

static void test_unknown_env(void **state)
{
    (void)state;
    setenv("XMESH_CHUNK_BYTE", "1", 1);      /* misspelt */
    setenv("XMESH_TEST_SEED_X", "1", 1);     /* belongs to tests */
    setenv("XMESH_BENCH_ITERS", "3", 1);     /* belongs to scripts */
    setenv("XMESH_STRATEGY", "sendrecv", 1); /* a parameter */
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    int n = xm_param_check_env(tmp);
    char buf[2048];
    rewind(tmp);
    size_t len = fread(buf, 1, sizeof buf - 1, tmp);
    buf[len] = '\0';
    fclose(tmp);
    assert_int_equal(n, 1);
    assert_non_null(strstr(buf, "XMESH_CHUNK_BYTE is set but is not an xmesh parameter"));
    assert_non_null(strstr(buf, "did you mean XMESH_CHUNK_BYTES?"));
    assert_null(strstr(buf, "XMESH_BENCH_ITERS"));
    unsetenv("XMESH_CHUNK_BYTE");
    unsetenv("XMESH_TEST_SEED_X");
    unsetenv("XMESH_BENCH_ITERS");
    unsetenv("XMESH_STRATEGY");
}

static char got_s[64];
static xmesh_result_t got_rc;
static void read_timeout_public(void)
{
    got_rc = xmesh_param_get_real("XMESH_TIMEOUT_S", &got_r);
}
static void read_overlap_public(void)
{
    got_rc = xmesh_param_get("XMP_OVERLAP", got_s, sizeof got_s, NULL);
}

/* The public by-name reads (include/xmesh.h): the training stack's rows are declared; values
 * come from the environment when valid, else the default; refusals leave outputs untouched. */
static void test_public_get(void **state)
{
    (void)state;
    static const char *const stack_rows[] = {"XMP_OVERLAP", "XMESH_KEEP_FREED", "XMESH_CKPT_CRASH",
                                             "XMESH_TIMEOUT_S", "XMESH_NICS_PER_HOST"};
    for (size_t i = 0; i < sizeof stack_rows / sizeof *stack_rows; i++)
        if (xm_param_find(stack_rows[i]) < 0)
            fail_msg("%s is not declared in the parameter table", stack_rows[i]);
    char buf[64], err[4096];
    int from = -1;
    unsetenv("XMP_OVERLAP");
    assert_int_equal(xmesh_param_get("XMP_OVERLAP", buf, sizeof buf, &from), XMESH_SUCCESS);
    assert_string_equal(buf, "none");
    assert_int_equal(from, 0);
    setenv("XMP_OVERLAP", "bwd-input,prefetch", 1);
    assert_int_equal(xmesh_param_get("XMP_OVERLAP", buf, sizeof buf, &from), XMESH_SUCCESS);
    assert_string_equal(buf, "bwd-input,prefetch"); /* re-read at each call */
    assert_int_equal(from, 1);
    capture_stderr(read_overlap_public, err, sizeof err);
    assert_int_equal(got_rc, XMESH_SUCCESS);
    assert_string_equal(got_s, "bwd-input,prefetch");
    assert_null(strstr(err, "not an xmesh parameter"));
    /* a buffer too small: refused naming both sizes, untouched */
    char small[8];
    memcpy(small, "keepme!", 8);
    assert_int_equal(xmesh_param_get("XMP_OVERLAP", small, sizeof small, NULL),
                     XMESH_ERR_INVALID_ARGUMENT);
    assert_string_equal(small, "keepme!");
    assert_non_null(strstr(xmesh_last_error(), "needs 19 bytes, the buffer has 8"));
    unsetenv("XMP_OVERLAP");
    setenv("XMESH_CKPT_CRASH", "2:exit", 1);
    assert_int_equal(xmesh_param_get("XMESH_CKPT_CRASH", buf, sizeof buf, NULL), XMESH_SUCCESS);
    assert_string_equal(buf, "2:exit");
    unsetenv("XMESH_CKPT_CRASH");
    assert_int_equal(xmesh_param_get("XMESH_CKPT_CRASH", buf, sizeof buf, &from), XMESH_SUCCESS);
    assert_string_equal(buf, "");
    assert_int_equal(from, 0);
    assert_int_equal(xmesh_param_get("XMESH_KEEP_FREED", buf, sizeof buf, NULL), XMESH_SUCCESS);
    assert_string_equal(buf, "1");

    /* undeclared names and NULLs */
    memcpy(buf, "same", 5);
    assert_int_equal(xmesh_param_get("XMESH_NO_SUCH_ROW", buf, sizeof buf, NULL),
                     XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "'XMESH_NO_SUCH_ROW' is not a declared parameter"));
    assert_string_equal(buf, "same");
    assert_int_equal(xmesh_param_get(NULL, buf, sizeof buf, NULL), XMESH_ERR_INVALID_ARGUMENT);
    assert_int_equal(xmesh_param_get("XMP_OVERLAP", NULL, 8, NULL), XMESH_ERR_INVALID_ARGUMENT);

    /* numbers: bytes with their suffix, reals, refusals keep the default with a warning */
    int64_t i = 777;
    double r = 777;
    setenv("XMESH_CHUNK_BYTES", "128K", 1);
    assert_int_equal(xmesh_param_get_int("XMESH_CHUNK_BYTES", &i), XMESH_SUCCESS);
    assert_int_equal(i, 131072);
    assert_int_equal(xmesh_param_get_real("XMESH_CHUNK_BYTES", &r), XMESH_SUCCESS);
    assert_true(r == 131072);
    unsetenv("XMESH_CHUNK_BYTES");
    setenv("XMESH_TIMEOUT_S", "2.5", 1);
    assert_int_equal(xmesh_param_get_real("XMESH_TIMEOUT_S", &r), XMESH_SUCCESS);
    assert_true(r == 2.5);
    setenv("XMESH_TIMEOUT_S", "-3", 1);
    capture_stderr(read_timeout_public, err, sizeof err);
    assert_int_equal(got_rc, XMESH_SUCCESS);
    assert_true(got_r == 300);
    assert_non_null(strstr(err, "XMESH_TIMEOUT_S=-3 refused"));
    unsetenv("XMESH_TIMEOUT_S");
    i = 777;
    assert_int_equal(xmesh_param_get_int("XMESH_TIMEOUT_S", &i), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(
        strstr(xmesh_last_error(), "a real parameter (read it with xmesh_param_get_real)"));
    assert_int_equal(i, 777);
    r = 777;
    assert_int_equal(xmesh_param_get_real("XMP_OVERLAP", &r), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(
        strstr(xmesh_last_error(), "a string parameter (read it with xmesh_param_get)"));
    assert_true(r == 777);
    assert_int_equal(xmesh_param_get_int("XMESH_NO_SUCH_ROW", &i), XMESH_ERR_INVALID_ARGUMENT);
    assert_int_equal(xmesh_param_get_int("XMESH_NICS_PER_HOST", NULL), XMESH_ERR_INVALID_ARGUMENT);
    xm_param_reset();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_int),    cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_typed_values), cmocka_unit_test(test_unknown_env),
        cmocka_unit_test(test_public_get),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
