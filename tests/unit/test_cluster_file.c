/* Cluster files: values applied, units converted, bad lines named, and the
 * cluster unchanged on error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xm_cluster_file.h"

static xm_cluster_t fresh(void)
{
    static int host_of[4] = {0, 0, 1, 1};
    xm_hostmap_t hm = {.ndev = 4, .nhosts = 2, .host_of = host_of};
    xm_cluster_t c;
    assert_int_equal(xm_cluster_init(&c, &hm), XMESH_SUCCESS);
    return c;
}

static void test_apply(void **state)
{
    (void)state;
    xm_cluster_t c = fresh();
    assert_true(c.nic_burst_bytes == 0); /* no token bucket unless a file says so */
    const char *text = "# fitted 2026-11-22\n"
                       "nic_send_gbps = 0.2   # shaper rate\n"
                       "nic_recv_gbps=0.4\n"
                       "\n"
                       "nics_per_host = 2\n"
                       "intra_gbps = 16\n"
                       "latency_us = 35.5\n"
                       "chunk_bytes = 65536\r\n"
                       "nic_burst_bytes = 65536  # tc tbf burst 64kb\n";
    assert_int_equal(xm_cluster_parse(text, &c), XMESH_SUCCESS);
    assert_true(c.nic_send_Bps == 0.2e9 / 8);
    assert_true(c.nic_recv_Bps == 0.4e9 / 8);
    assert_int_equal(c.nics_per_host, 2);
    assert_true(c.intra_Bps == 16e9 / 8);
    assert_true(c.latency_s > 35.49e-6 && c.latency_s < 35.51e-6);
    assert_int_equal(c.chunk_bytes, 65536);
    assert_true(c.nic_burst_bytes == 65536);
    /* 0 is allowed (no burst) and a later value replaces an earlier one */
    assert_int_equal(xm_cluster_parse("nic_burst_bytes = 0\n", &c), XMESH_SUCCESS);
    assert_true(c.nic_burst_bytes == 0);
    xm_cluster_free(&c);
}

static void expect_bad(const char *text, const char *needle)
{
    xm_cluster_t c = fresh(), before = c;
    assert_int_equal(xm_cluster_parse(text, &c), XMESH_ERR_INVALID_ARGUMENT);
    assert_memory_equal(&c, &before, sizeof c);
    if (!strstr(xmesh_last_error(), needle))
        fail_msg("message '%s' lacks '%s'", xmesh_last_error(), needle);
    xm_cluster_free(&c);
}

static void test_bad(void **state)
{
    (void)state;
    expect_bad("nic_gbps = 10\nnic_gpbs = 3\n", "line 2: unknown key 'nic_gpbs'");
    expect_bad("nic_gbps = fast\n", "nic_gbps = 'fast' is not a number");
    expect_bad("nic_gbps = 0\n", "must be > 0");
    expect_bad("latency_us = -1\n", "must be >= 0");
    expect_bad("nic_burst_bytes = -65536\n", "nic_burst_bytes = -65536 must be >= 0");
    expect_bad("nic_burst_bytes = 64kb\n", "nic_burst_bytes = '64kb' is not a number");
    expect_bad("nics_per_host = 1.5\n", "whole number");
    expect_bad("nics_per_host = 1000\n", "whole number");
    expect_bad("nic_gbps 10\n", "line 1: 'nic_gbps 10' is not of the form key = value");
    expect_bad("nic_gbps = 10\nchunk_bytes = nan\n", "line 2");
}

static void test_load(void **state)
{
    (void)state;
    char path[] = "/tmp/xmesh-cluster-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("nic_gbps = 0.2\n", f);
    fclose(f);
    xm_cluster_t c = fresh();
    assert_int_equal(xm_cluster_load(path, &c), XMESH_SUCCESS);
    assert_true(c.nic_recv_Bps == 0.2e9 / 8);
    remove(path);
    assert_int_equal(xm_cluster_load(path, &c), XMESH_ERR_SYSTEM);
    assert_non_null(strstr(xmesh_last_error(), path));
    xm_cluster_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
