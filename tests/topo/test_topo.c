/* hwloc topology on XML fixtures: a 4-GPU/2-NIC and an 8-GPU/4-NIC node
 * (tests/topo/gen_fixtures.py documents their layout). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "xm_core.h"
#include "xm_topo.h"

static xm_topo_t *load(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", XM_TOPO_FIXTURES, name);
    xm_topo_t *t = NULL;
    xmesh_result_t r = xm_topo_load(path, &t);
    if (r)
        fail_msg("xm_topo_load(%s): %s", path, xmesh_last_error());
    assert_non_null(t);
    return t;
}

static void test_node4(void **state)
{
    (void)state;
    xm_topo_t *t = load("node4gpu2nic.xml");
    assert_string_equal(t->hostname, "gpu4-node");
    assert_true(t->host_id == xm_hash64(XM_HASH_INIT, "gpu4-node", 9));
    assert_int_equal(t->npus, 16);
    assert_int_equal(t->nnuma, 2);
    /* The ASPEED VGA (vendor 1a03) is not a GPU; the NVMe is not a NIC. */
    assert_int_equal(xm_topo_gpus(t), 4);
    assert_int_equal(xm_topo_nics(t), 2);
    assert_int_equal(xm_topo_nics_per_host(t), 2);
    const char *bus[4] = {"0000:01:00.0", "0000:01:01.0", "0000:41:00.0", "0000:41:01.0"};
    const int nic[4] = {0, 0, 1, 1};
    for (int g = 0; g < 4; g++) {
        char name[16];
        snprintf(name, sizeof name, "cuda%d", g);
        assert_string_equal(t->gpus[g].busid, bus[g]);
        assert_string_equal(t->gpus[g].name, name);
        assert_int_equal(t->gpus[g].cuda_index, g);
        assert_int_equal(t->gpus[g].vendor, 0x10de);
        assert_int_equal(xm_topo_nic_for_gpu(t, g), nic[g]);
        assert_int_equal(t->gpus[g].nic_distance, 2); /* GPU - switch - NIC */
        assert_int_equal(t->gpus[g].numa, g / 2);
        assert_string_equal(t->gpus[g].cpuset, g < 2 ? "0-7" : "8-15");
    }
    /* Across packages: GPU-switch-hostbridge-package-machine and back down. */
    assert_int_equal(t->gpu_nic_dist[0 * 2 + 1], 8);
    assert_string_equal(t->nics[0].name, "mlx5_0");
    assert_string_equal(t->nics[0].netdev, "ib0");
    assert_string_equal(t->nics[1].name, "mlx5_1");
    assert_int_equal(t->nics[1].class_id, 0x0207);
    assert_string_equal(t->nics[1].cpuset, "8-15");
    assert_int_equal(xm_topo_gpu_for_nic(t, 0), 0);
    assert_int_equal(xm_topo_gpu_for_nic(t, 1), 2);
    assert_int_equal(t->nics[0].ngpus_closest, 2);
    assert_int_equal(t->nics[1].ngpus_closest, 2);
    /* Out of range queries. */
    assert_int_equal(xm_topo_nic_for_gpu(t, 4), -1);
    assert_int_equal(xm_topo_nic_for_gpu(t, -1), -1);
    assert_int_equal(xm_topo_gpu_for_nic(t, 2), -1);
    xm_topo_free(t);
}

static void test_node8(void **state)
{
    (void)state;
    xm_topo_t *t = load("node8gpu4nic.xml");
    assert_string_equal(t->hostname, "gpu8-node");
    assert_int_equal(t->npus, 32);
    assert_int_equal(xm_topo_gpus(t), 8);
    assert_int_equal(xm_topo_nics(t), 4);
    assert_int_equal(xm_topo_nics_per_host(t), 4);
    for (int g = 0; g < 8; g++) {
        assert_int_equal(xm_topo_nic_for_gpu(t, g), g / 2);
        assert_int_equal(t->gpus[g].nic_distance, 2);
        assert_int_equal(t->gpus[g].numa, g / 4);
        assert_string_equal(t->gpus[g].cpuset, g < 4 ? "0-15" : "16-31");
    }
    /* GPU 5 has no CUDA OS device: found by its PCI ids, no name. */
    assert_int_equal(t->gpus[5].cuda_index, -1);
    assert_string_equal(t->gpus[5].name, "");
    assert_int_equal(t->gpus[6].cuda_index, 6);
    /* Same package, other switch: GPU-sw-hostbridge-sw-NIC = 4 hops. */
    assert_int_equal(t->gpu_nic_dist[0 * 4 + 1], 4);
    assert_int_equal(t->gpu_nic_dist[0 * 4 + 3], 8);
    /* NIC 3 has only an Ethernet interface. */
    assert_string_equal(t->nics[3].name, "eth3");
    assert_string_equal(t->nics[3].netdev, "eth3");
    assert_int_equal(t->nics[3].class_id, 0x0200);
    for (int n = 0; n < 4; n++) {
        assert_int_equal(xm_topo_gpu_for_nic(t, n), 2 * n);
        assert_int_equal(t->nics[n].ngpus_closest, 2);
    }
    xm_topo_free(t);
}

static void test_pick_sender(void **state)
{
    (void)state;
    xm_topo_t *t = load("node8gpu4nic.xml");
    int even[4] = {0, 2, 4, 6};
    assert_int_equal(xm_topo_pick_sender(t, even, 4, 2), 4);
    assert_int_equal(xm_topo_pick_sender(t, even, 4, 1), 2);
    int pair[2] = {5, 4}; /* tie: the earliest candidate */
    assert_int_equal(xm_topo_pick_sender(t, pair, 2, 2), 5);
    int same_pkg[2] = {1, 3}; /* both 8 hops from NIC 3 (other package): the first */
    assert_int_equal(xm_topo_pick_sender(t, same_pkg, 2, 3), 1);
    int mixed[3] = {1, 3, 7};
    assert_int_equal(xm_topo_pick_sender(t, mixed, 3, 3), 7);
    int bad[2] = {1, 8};
    assert_int_equal(xm_topo_pick_sender(t, bad, 2, 0), -1);
    assert_int_equal(xm_topo_pick_sender(t, even, 0, 0), -1);
    assert_int_equal(xm_topo_pick_sender(t, even, 4, 4), -1);
    xm_topo_free(t);
}

static void test_busid(void **state)
{
    (void)state;
    xm_topo_t *t = load("node8gpu4nic.xml");
    /* cudaDeviceGetPCIBusId prints an 8-digit domain in upper case. */
    assert_int_equal(xm_topo_gpu_by_busid(t, "00000000:41:01.0"), 5);
    assert_int_equal(xm_topo_gpu_by_busid(t, "0000:42:01.0"), 7);
    assert_int_equal(xm_topo_gpu_by_busid(t, "02:00.0"), 2);
    assert_int_equal(xm_topo_gpu_by_busid(t, "0000:01:02.0"), -1); /* a NIC */
    assert_int_equal(xm_topo_gpu_by_busid(t, NULL), -1);
    xm_topo_free(t);
}

static void test_print(void **state)
{
    (void)state;
    xm_topo_t *t = load("node4gpu2nic.xml");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    xm_topo_print(t, f);
    fclose(f);
    assert_non_null(strstr(buf, "host gpu4-node"));
    assert_non_null(strstr(buf, "4 GPUs, 2 NICs"));
    assert_non_null(strstr(buf, "gpu 3  0000:41:01.0"));
    assert_non_null(strstr(buf, "mlx5_1"));
    free(buf);
    xm_topo_free(t);
}

static void test_missing_file(void **state)
{
    (void)state;
    xm_topo_t *sentinel = (xm_topo_t *)(uintptr_t)0x1;
    xm_topo_t *t = sentinel;
    assert_int_equal(xm_topo_load("/nonexistent/topo.xml", &t), XMESH_ERR_SYSTEM);
    assert_ptr_equal(t, sentinel);
    assert_non_null(strstr(xmesh_last_error(), "/nonexistent/topo.xml"));
    assert_int_equal(xm_topo_load(NULL, NULL), XMESH_ERR_INVALID_ARGUMENT);
    xm_topo_free(NULL);
}

/* This machine: whatever it has, the answers must be consistent. */
static void test_live(void **state)
{
    (void)state;
    xm_topo_t *t = NULL;
    assert_int_equal(xm_topo_load(NULL, &t), XMESH_SUCCESS);
    assert_true(t->npus >= 1);
    assert_true(xm_topo_nics_per_host(t) >= 1);
    for (int g = 0; g < t->ngpus; g++)
        assert_true(t->gpus[g].nic >= -1 && t->gpus[g].nic < t->nnics);
    char hn[64] = "";
    gethostname(hn, sizeof hn - 1);
    assert_string_equal(t->hostname, hn);
    xm_topo_print(t, stdout);
    xm_topo_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node4),       cmocka_unit_test(test_node8),
        cmocka_unit_test(test_pick_sender), cmocka_unit_test(test_busid),
        cmocka_unit_test(test_print),       cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_live),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
