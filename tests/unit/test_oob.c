/*
 * The out-of-band collectives of lib/plan/oob.c (what a context without MPI
 * agrees on) with N ranks simulated by N threads of one process: a test
 * all-gather over a shared buffer and a barrier stands in for the
 * framework's. Every rank's verdict is checked: agreement, mismatch, a
 * failing rank named (the lowest), host grouping, broadcast, a failing
 * all-gather.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xm_oob.h"

#define MAXR 8

typedef struct {
    int n;
    pthread_barrier_t bar;
    char buf[MAXR * 256];
    int fail_rank; /* this rank's all-gather fails (-1 none) */
} world_t;

typedef struct {
    world_t *w;
    int rank;
} user_t;

static int test_allgather(void *u, const void *send, void *recv, size_t bytes)
{
    user_t *me = u;
    world_t *w = me->w;
    if (bytes > 256)
        return 7;
    memcpy(w->buf + (size_t)me->rank * bytes, send, bytes);
    pthread_barrier_wait(&w->bar);
    memcpy(recv, w->buf, bytes * (size_t)w->n);
    pthread_barrier_wait(&w->bar);
    return me->rank == w->fail_rank ? 3 : 0;
}

/* What each simulated rank does and what it got. */
typedef struct {
    user_t u;
    xmesh_oob_t oob;
    int scenario;
    xmesh_result_t r;
    char msg[512];
    int host_of[MAXR], nhosts, local_rank;
    char bcast[16];
} rank_t;

enum { S_AGREE, S_MISMATCH, S_FAIL_ONE, S_FAIL_TWO, S_HOST_IDS, S_HOST_NAMES, S_BCAST, S_BROKEN };

static void *rank_main(void *arg)
{
    rank_t *k = arg;
    int me = k->u.rank;
    xm_hostmap_t hm;
    switch (k->scenario) {
    case S_AGREE:
        k->r = xm_oob_agree(&k->oob, XMESH_SUCCESS, 42, NULL, NULL, 0, "test");
        break;
    case S_MISMATCH:
        k->r = xm_oob_agree(&k->oob, XMESH_SUCCESS, me == 1 ? 43 : 42, NULL, NULL, 0, "test");
        break;
    case S_FAIL_ONE:
        k->r = xm_oob_agree(&k->oob, me == 2 ? XMESH_ERR_INVALID_ARGUMENT : XMESH_SUCCESS, 42, NULL,
                            NULL, 0, "test");
        break;
    case S_FAIL_TWO:
        k->r = xm_oob_agree(&k->oob, me == 3 || me == 1 ? XMESH_ERR_NO_MEMORY : XMESH_SUCCESS, 42,
                            NULL, NULL, 0, "test");
        break;
    case S_HOST_IDS: {
        static const int ids[MAXR] = {5, 5, 9, 5, 9, 1, 1, 5};
        k->r = xm_oob_hosts(&k->oob, ids[me], &k->local_rank, &hm);
        if (!k->r) {
            memcpy(k->host_of, hm.host_of, sizeof(int) * hm.ndev);
            k->nhosts = hm.nhosts;
            xm_hostmap_free(&hm);
        }
        break;
    }
    case S_HOST_NAMES: /* one process: every rank has this machine's name */
        k->r = xm_oob_hosts(&k->oob, me == 0 ? 3 : XMESH_UNSET_INT, &k->local_rank, &hm);
        if (!k->r) {
            memcpy(k->host_of, hm.host_of, sizeof(int) * hm.ndev);
            k->nhosts = hm.nhosts;
            xm_hostmap_free(&hm);
        }
        break;
    case S_BCAST:
        snprintf(k->bcast, sizeof k->bcast, "from %d", me);
        k->r = xm_oob_bcast(&k->oob, k->bcast, sizeof k->bcast, 2, "test");
        break;
    case S_BROKEN:
        k->r = xm_oob_agree(&k->oob, XMESH_SUCCESS, 42, NULL, NULL, 0, "test");
        break;
    }
    snprintf(k->msg, sizeof k->msg, "%s", xmesh_last_error());
    return NULL;
}

static void run(int n, int scenario, int fail_rank, rank_t *ranks)
{
    static world_t w;
    memset(&w, 0, sizeof w);
    w.n = n;
    w.fail_rank = fail_rank;
    pthread_barrier_init(&w.bar, NULL, (unsigned)n);
    pthread_t th[MAXR];
    for (int i = 0; i < n; i++) {
        memset(&ranks[i], 0, sizeof ranks[i]);
        ranks[i].u = (user_t){&w, i};
        ranks[i].oob = (xmesh_oob_t){i, n, test_allgather, &ranks[i].u};
        ranks[i].scenario = scenario;
        assert_int_equal(xm_oob_check(&ranks[i].oob), XMESH_SUCCESS);
        pthread_create(&th[i], NULL, rank_main, &ranks[i]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&w.bar);
}

static void test_agree(void **state)
{
    (void)state;
    rank_t k[MAXR];
    run(5, S_AGREE, -1, k);
    for (int i = 0; i < 5; i++)
        assert_int_equal(k[i].r, XMESH_SUCCESS);
    run(5, S_MISMATCH, -1, k);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(k[i].r, XMESH_ERR_MISMATCH);
        assert_non_null(strstr(k[i].msg, "different plan inputs"));
    }
}

static void test_failing_rank_named(void **state)
{
    (void)state;
    rank_t k[MAXR];
    run(4, S_FAIL_ONE, -1, k);
    for (int i = 0; i < 4; i++) {
        if (i == 2) {
            assert_int_equal(k[i].r, XMESH_ERR_INVALID_ARGUMENT);
        } else {
            assert_int_equal(k[i].r, XMESH_ERR_REMOTE);
            assert_non_null(strstr(k[i].msg, "rank 2 failed"));
        }
    }
    run(5, S_FAIL_TWO, -1, k);
    for (int i = 0; i < 5; i++)
        if (i != 1 && i != 3) {
            assert_int_equal(k[i].r, XMESH_ERR_REMOTE);
            assert_non_null(strstr(k[i].msg, "rank 1 failed")); /* the lowest */
        }
}

static void test_hosts(void **state)
{
    (void)state;
    rank_t k[MAXR];
    run(8, S_HOST_IDS, -1, k);
    static const int want[MAXR] = {0, 0, 1, 0, 1, 2, 2, 0};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(k[i].r, XMESH_SUCCESS);
        assert_int_equal(k[i].nhosts, 3);
        assert_memory_equal(k[i].host_of, want, sizeof want);
        /* local_rank follows the real host names: all on this machine */
        assert_int_equal(k[i].local_rank, i);
    }
    /* ids on some ranks only: the names decide (one machine, one host) */
    run(3, S_HOST_NAMES, -1, k);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(k[i].r, XMESH_SUCCESS);
        assert_int_equal(k[i].nhosts, 1);
    }
}

static void test_bcast(void **state)
{
    (void)state;
    rank_t k[MAXR];
    run(4, S_BCAST, -1, k);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(k[i].r, XMESH_SUCCESS);
        assert_string_equal(k[i].bcast, "from 2");
    }
}

static void test_broken_allgather(void **state)
{
    (void)state;
    rank_t k[MAXR];
    run(3, S_BROKEN, 1, k);
    assert_int_equal(k[1].r, XMESH_ERR_BACKEND);
    assert_non_null(strstr(k[1].msg, "out-of-band all-gather (test) failed"));
    xmesh_oob_t bad = {4, 4, test_allgather, NULL};
    assert_int_equal(xm_oob_check(&bad), XMESH_ERR_INVALID_ARGUMENT);
    bad = (xmesh_oob_t){0, 0, test_allgather, NULL};
    assert_int_equal(xm_oob_check(&bad), XMESH_ERR_INVALID_ARGUMENT);
    bad = (xmesh_oob_t){0, 1, NULL, NULL};
    assert_int_equal(xm_oob_check(&bad), XMESH_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agree),
        cmocka_unit_test(test_failing_rank_named),
        cmocka_unit_test(test_hosts),
        cmocka_unit_test(test_bcast),
        cmocka_unit_test(test_broken_allgather),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
