/* Spec decomposer: golden cases from the paper (Fig. 2 / Appendix B,
 * Table 2 case 4) and property tests over random layouts: every destination
 * block is tiled exactly once by its tasks, every holder holds its box, and
 * holders/receivers are complete. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "xm_core.h"

typedef struct {
    xm_layout_t src, dst;
    int sdev[64], ddev[64];
} pair_t;

static void make_layout(xm_layout_t *l, int ndim, const int64_t *shape, int mesh_ndim,
                        const int *mshape, const int *devs, const char *spec)
{
    memset(l, 0, sizeof *l);
    l->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        l->shape[d] = shape[d];
    l->elem_size = 4;
    l->mesh.ndim = mesh_ndim;
    l->mesh.ndev = 1;
    for (int a = 0; a < mesh_ndim; a++) {
        l->mesh.shape[a] = mshape[a];
        l->mesh.ndev *= mshape[a];
    }
    l->mesh.devs = devs;
    if (xm_spec_parse(spec, ndim, mesh_ndim, &l->spec))
        fail_msg("spec '%s': %s", spec, xmesh_last_error());
}

static void test_split_rule(void **state)
{
    (void)state;
    int64_t lo, hi;
    /* numpy.array_split(5, 3) -> 2, 2, 1 */
    xm_split(5, 3, 0, &lo, &hi);
    assert_true(lo == 0 && hi == 2);
    xm_split(5, 3, 1, &lo, &hi);
    assert_true(lo == 2 && hi == 4);
    xm_split(5, 3, 2, &lo, &hi);
    assert_true(lo == 4 && hi == 5);
    /* more shards than elements: 1, 1, 0, 0 */
    xm_split(2, 4, 1, &lo, &hi);
    assert_true(lo == 1 && hi == 2);
    xm_split(2, 4, 3, &lo, &hi);
    assert_true(lo == 2 && hi == 2);
}

/* torch.chunk as DTensor's Shard(d) uses it, the test's own way: chunks of
 * ceil(n / k) cut from the front while elements remain, then empty chunks
 * at the end up to k. */
static void ref_chunk(int64_t n, int64_t k, int64_t *lo, int64_t *hi)
{
    int64_t size = n / k + (n % k ? 1 : 0), left = n, at = 0;
    for (int64_t i = 0; i < k; i++) {
        int64_t take = left < size ? left : size;
        lo[i] = at;
        hi[i] = at + take;
        at += take;
        left -= take;
    }
}

static void test_torch_split_rule(void **state)
{
    (void)state;
    /* golden: torch.chunk(arange(5), 4) -> 2, 2, 1 (+ one empty shard);
     * numpy.array_split gives 2, 1, 1, 1 */
    int64_t want5[4][2] = {{0, 2}, {2, 4}, {4, 5}, {5, 5}}, lo, hi;
    for (int i = 0; i < 4; i++) {
        xm_split_torch(5, 4, i, &lo, &hi);
        assert_true(lo == want5[i][0] && hi == want5[i][1]);
    }
    /* 4 over 3: 2, 2, 0 (a whole empty shard); 0 over 2: empty, empty */
    xm_split_torch(4, 3, 2, &lo, &hi);
    assert_true(lo == 4 && hi == 4);
    xm_split_torch(0, 2, 1, &lo, &hi);
    assert_true(lo == 0 && hi == 0);
    /* every n, k: one axis, the layout's block math against ref_chunk, and
     * the shard holding each position */
    int dev[64];
    for (int i = 0; i < 64; i++)
        dev[i] = i;
    for (int64_t n = 0; n <= 40; n++)
        for (int k = 1; k <= 9; k++) {
            int64_t rlo[9], rhi[9];
            ref_chunk(n, k, rlo, rhi);
            xm_layout_t l;
            int64_t shape[1] = {n};
            int mshape[1] = {k};
            make_layout(&l, 1, shape, 1, mshape, dev, "S0");
            l.split = XMESH_SPLIT_TORCH;
            for (int i = 0; i < k; i++) {
                int64_t blo[1], bhi[1];
                xm_layout_block(&l, i, blo, bhi);
                if (blo[0] != rlo[i] || bhi[0] != rhi[i])
                    fail_msg("n=%lld k=%d shard %d: [%lld, %lld), torch.chunk [%lld, %lld)",
                             (long long)n, k, i, (long long)blo[0], (long long)bhi[0],
                             (long long)rlo[i], (long long)rhi[i]);
            }
            for (int64_t p = 0; p < n; p++) {
                int64_t j = xm_layout_shard_at(&l, 0, p);
                if (j < 0 || j >= k || p < rlo[j] || p >= rhi[j])
                    fail_msg("n=%lld k=%d: position %lld said to be in shard %lld", (long long)n, k,
                             (long long)p, (long long)j);
            }
        }
    /* two axes on one dim: chunk by the major axis, then chunk that piece.
     * 10 over 2x2: 3, 2, 3, 2 (numpy's single cut: 3, 3, 2, 2); S10 makes
     * axis 1 the major one. */
    for (int64_t n = 0; n <= 30; n++)
        for (int k0 = 1; k0 <= 4; k0++)
            for (int k1 = 1; k1 <= 4; k1++)
                for (int swap = 0; swap < 2; swap++) {
                    xm_layout_t l;
                    int64_t shape[1] = {n};
                    int mshape[2] = {k0, k1};
                    make_layout(&l, 1, shape, 2, mshape, dev, swap ? "S10" : "S01");
                    l.split = XMESH_SPLIT_TORCH;
                    int kmaj = swap ? k1 : k0, kmin = swap ? k0 : k1;
                    int64_t olo[4], ohi[4];
                    ref_chunk(n, kmaj, olo, ohi);
                    for (int i = 0; i < k0 * k1; i++) {
                        int c0 = i / k1, c1 = i % k1, jmaj = swap ? c1 : c0, jmin = swap ? c0 : c1;
                        int64_t ilo[4], ihi[4], blo[1], bhi[1];
                        ref_chunk(ohi[jmaj] - olo[jmaj], kmin, ilo, ihi);
                        xm_layout_block(&l, i, blo, bhi);
                        if (blo[0] != olo[jmaj] + ilo[jmin] || bhi[0] != olo[jmaj] + ihi[jmin])
                            fail_msg("n=%lld mesh %dx%d %s device %d: [%lld, %lld), nested "
                                     "torch.chunk [%lld, %lld)",
                                     (long long)n, k0, k1, swap ? "S10" : "S01", i,
                                     (long long)blo[0], (long long)bhi[0],
                                     (long long)(olo[jmaj] + ilo[jmin]),
                                     (long long)(olo[jmaj] + ihi[jmin]));
                    }
                    for (int64_t p = 0; p < n; p++) {
                        int64_t j = xm_layout_shard_at(&l, 0, p), blo, bhi;
                        xm_layout_dim_block(&l, 0, j, &blo, &bhi);
                        if (p < blo || p >= bhi)
                            fail_msg("n=%lld mesh %dx%d: position %lld not in shard %lld",
                                     (long long)n, k0, k1, (long long)p, (long long)j);
                    }
                }
}

static void check_invariants(const xm_layout_t *s, const xm_layout_t *d, const xm_taskset_t *ts,
                             int iter);

/* A numpy-split layout to a torch-split one on the same devices: the tasks
 * are the pieces where the two cuts differ. 6 over 4: numpy 2,2,1,1, torch
 * 2,2,2,0: device 0 and 1 keep theirs, row 4 goes 2 -> 2, row 5 goes 3 -> 2. */
static void test_numpy_to_torch(void **state)
{
    (void)state;
    int64_t shape[1] = {6};
    int mshape[1] = {4}, dev[4] = {0, 1, 2, 3};
    xm_layout_t s, d;
    make_layout(&s, 1, shape, 1, mshape, dev, "S0");
    make_layout(&d, 1, shape, 1, mshape, dev, "S0");
    d.split = XMESH_SPLIT_TORCH;
    xm_taskset_t ts;
    assert_int_equal(xm_decompose(&s, &d, NULL, &ts), XMESH_SUCCESS);
    assert_int_equal(ts.ntasks, 4); /* cuts 0,2,4,5,6 */
    int64_t want[4][2] = {{0, 2}, {2, 4}, {4, 5}, {5, 6}};
    int holder[4] = {0, 1, 2, 3}, recv[4] = {0, 1, 2, 2};
    for (int i = 0; i < 4; i++) {
        const xm_task_t *t = &ts.tasks[i];
        assert_true(t->box.lo[0] == want[i][0] && t->box.hi[0] == want[i][1]);
        assert_int_equal(t->nrecv, 1);
        assert_int_equal(ts.holders[t->holder_off], holder[i]);
        assert_int_equal(ts.recvs[t->recv_off], recv[i]);
    }
    check_invariants(&s, &d, &ts, -1);
    xm_taskset_free(&ts);
}

/* Paper Fig. 2: a 4x4 matrix, meshes A = [[0,1],[2,3]] and B = [[4,5],[6,7]]. */
static void test_paper_fig2(void **state)
{
    (void)state;
    int64_t shape[2] = {4, 4};
    int mshape[2] = {2, 2}, a[4] = {0, 1, 2, 3}, b[4] = {4, 5, 6, 7};
    xm_layout_t s1, s2, s3;
    make_layout(&s1, 2, shape, 2, mshape, a, "S01R"); /* one row per device */
    make_layout(&s2, 2, shape, 2, mshape, b, "S0R");  /* 2x4 halves, replicated on axis 1 */
    make_layout(&s3, 2, shape, 2, mshape, a, "S0R");
    xm_taskset_t ts;
    assert_int_equal(xm_decompose(&s1, &s2, NULL, &ts), XMESH_SUCCESS);
    assert_int_equal(ts.ntasks, 4);
    /* first unit task: row 0 (elements 0..3) from device 0 to devices 4 and 5 */
    xm_task_t *t = &ts.tasks[0];
    assert_true(t->box.lo[0] == 0 && t->box.hi[0] == 1 && t->box.lo[1] == 0 && t->box.hi[1] == 4);
    assert_int_equal(t->ngroups * t->group_size, 1);
    assert_int_equal(ts.holders[t->holder_off], 0);
    assert_int_equal(t->nrecv, 2);
    assert_int_equal(ts.recvs[t->recv_off], 4);
    assert_int_equal(ts.recvs[t->recv_off + 1], 5);
    assert_int_equal(t->bytes, 16);
    xm_taskset_free(&ts);

    assert_int_equal(xm_decompose(&s2, &s3, NULL, &ts), XMESH_SUCCESS);
    assert_int_equal(ts.ntasks, 2);
    t = &ts.tasks[0];
    assert_true(t->box.lo[0] == 0 && t->box.hi[0] == 2 && t->box.hi[1] == 4);
    assert_int_equal(t->group_size, 2); /* replicas on devices 4 and 5 */
    assert_int_equal(ts.holders[t->holder_off], 4);
    assert_int_equal(ts.holders[t->holder_off + 1], 5);
    assert_int_equal(t->nrecv, 2);
    assert_int_equal(ts.recvs[t->recv_off], 0);
    assert_int_equal(ts.recvs[t->recv_off + 1], 1);
    xm_taskset_free(&ts);
}

/* Table 2 case 4: RS01R -> S01RR on (2,4) -> (2,4): 64 unit tasks. */
static void test_table2_case4(void **state)
{
    (void)state;
    int ss[2] = {2, 4}, ds[2] = {2, 4}, *sd, *dd;
    xm_hostmap_t hm;
    assert_int_equal(xm_hostmap_default(ss, 2, ds, 2, 0, &hm, &sd, &dd), XMESH_SUCCESS);
    assert_int_equal(hm.nhosts, 4);
    int64_t shape[3] = {1024, 1024, 512};
    xm_layout_t s, d;
    make_layout(&s, 3, shape, 2, ss, sd, "RS01R");
    make_layout(&d, 3, shape, 2, ds, dd, "S01RR");
    xm_taskset_t ts;
    assert_int_equal(xm_decompose(&s, &d, &hm, &ts), XMESH_SUCCESS);
    assert_int_equal(ts.ntasks, 64);
    for (int i = 0; i < ts.ntasks; i++) {
        assert_int_equal(ts.tasks[i].bytes, 128 * 128 * 512 * 4);
        assert_int_equal(ts.tasks[i].nrecv, 1);
        assert_int_equal(ts.tasks[i].group_size * ts.tasks[i].ngroups, 1);
    }
    assert_int_equal(ts.bytes_total, 1024LL * 1024 * 512 * 4);
    assert_int_equal(ts.bytes_cross_host, ts.bytes_total);
    xm_taskset_free(&ts);
    xm_hostmap_free(&hm);
    free(sd);
    free(dd);
}

/* A partial source: P over a 2-device mesh into one replicated device. */
static void test_partial_groups(void **state)
{
    (void)state;
    int64_t shape[1] = {6};
    int ms[2] = {2, 2}, a[4] = {0, 1, 2, 3}, one[1] = {1}, b[1] = {7};
    xm_layout_t s, d;
    make_layout(&s, 1, shape, 2, ms, a, "S(0),P");
    make_layout(&d, 1, shape, 1, one, b, "R");
    xm_taskset_t ts;
    assert_int_equal(xm_decompose(&s, &d, NULL, &ts), XMESH_SUCCESS);
    assert_int_equal(ts.ntasks, 2);
    xm_task_t *t = &ts.tasks[1];
    assert_int_equal(t->ngroups, 2);
    assert_int_equal(t->group_size, 1);
    assert_int_equal(ts.holders[t->holder_off], 2); /* group 0: coordinate (1, 0) */
    assert_int_equal(ts.holders[t->holder_off + 1], 3);
    xm_taskset_free(&ts);
    /* partial destinations are refused, naming the reason */
    make_layout(&d, 1, shape, 2, ms, a, "B,P");
    xm_taskset_t untouched;
    memset(&untouched, 0x77, sizeof untouched);
    xm_taskset_t copy = untouched;
    assert_int_equal(xm_decompose(&s, &d, NULL, &untouched), XMESH_ERR_UNSUPPORTED);
    assert_memory_equal(&untouched, &copy, sizeof copy);
    assert_non_null(strstr(xmesh_last_error(), "partial"));
}

static int box_in_block(const xm_box_t *b, const int64_t *lo, const int64_t *hi, int nd)
{
    for (int d = 0; d < nd; d++)
        if (b->lo[d] < lo[d] || b->hi[d] > hi[d])
            return 0;
    return 1;
}

/* Random spec string over a mesh: per mesh axis B, S(d) or (source only) P. */
static void random_spec(uint64_t *seed, int ndim, int mesh_ndim, int allow_p, char *buf)
{
    int n = 0;
    for (int a = 0; a < mesh_ndim; a++) {
        int what = xt_range(seed, 0, allow_p ? 3 : 2);
        const char *sep = a ? "," : "";
        if (what == 1 && ndim > 0)
            n += sprintf(buf + n, "%sS(%d)", sep, xt_range(seed, 0, ndim - 1));
        else if (what == 3)
            n += sprintf(buf + n, "%sP", sep);
        else
            n += sprintf(buf + n, "%sB", sep);
    }
}

static void random_mesh(uint64_t *seed, int *ndim, int *shape, int maxdev)
{
    int n;
    do {
        *ndim = xt_range(seed, 1, 4);
        n = 1;
        for (int a = 0; a < *ndim; a++) {
            shape[a] = xt_range(seed, 1, 3);
            n *= shape[a];
        }
    } while (n > maxdev);
}

static void check_invariants(const xm_layout_t *s, const xm_layout_t *d, const xm_taskset_t *ts,
                             int iter)
{
    int nd = s->ndim;
    int64_t total = 1;
    for (int k = 0; k < nd; k++)
        total *= s->shape[k];
    /* global coverage: task boxes are disjoint and tile the tensor */
    unsigned char *cover = calloc(total ? total : 1, 1);
    int64_t vol_sum = 0;
    for (int i = 0; i < ts->ntasks; i++) {
        const xm_task_t *t = &ts->tasks[i];
        int64_t v = xm_box_volume(&t->box, nd);
        if (v <= 0)
            fail_msg("iter %d: task %d has an empty box", iter, i);
        assert_int_equal(t->bytes, v * (int64_t)s->elem_size);
        vol_sum += v;
        int64_t idx[XM_MAX_DIMS];
        for (int k = 0; k < nd; k++)
            idx[k] = t->box.lo[k];
        for (int64_t e = 0; e < v; e++) {
            int64_t lin = 0;
            for (int k = 0; k < nd; k++)
                lin = lin * s->shape[k] + idx[k];
            if (cover[lin]++)
                fail_msg("iter %d: element %lld covered twice", iter, (long long)lin);
            for (int k = nd - 1; k >= 0; k--) {
                if (++idx[k] < t->box.hi[k])
                    break;
                idx[k] = t->box.lo[k];
            }
        }
        /* holders: exactly the source devices whose block contains the box */
        int nh = t->ngroups * t->group_size, found = 0;
        for (int j = 0; j < s->mesh.ndev; j++) {
            int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS];
            xm_layout_block(s, j, lo, hi);
            int listed = 0;
            for (int h = 0; h < nh; h++)
                listed |= ts->holders[t->holder_off + h] == s->mesh.devs[j];
            int holds = box_in_block(&t->box, lo, hi, nd);
            if (listed != holds)
                fail_msg("iter %d task %d: device %d holds=%d listed=%d", iter, i, s->mesh.devs[j],
                         holds, listed);
            found += holds;
        }
        assert_int_equal(found, nh);
        /* receivers: exactly the destination devices whose block contains it */
        found = 0;
        for (int j = 0; j < d->mesh.ndev; j++) {
            int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS];
            xm_layout_block(d, j, lo, hi);
            int listed = 0;
            for (int h = 0; h < t->nrecv; h++)
                listed |= ts->recvs[t->recv_off + h] == d->mesh.devs[j];
            int needs = box_in_block(&t->box, lo, hi, nd);
            if (listed != needs)
                fail_msg("iter %d task %d: dst device %d needs=%d listed=%d", iter, i,
                         d->mesh.devs[j], needs, listed);
            found += needs;
        }
        assert_int_equal(found, t->nrecv);
        if (t->nrecv == 0)
            fail_msg("iter %d task %d has no receiver", iter, i);
    }
    assert_int_equal(vol_sum, total);
    for (int64_t e = 0; e < total; e++)
        if (cover[e] != 1)
            fail_msg("iter %d: element %lld covered %d times", iter, (long long)e, cover[e]);
    /* every destination block is tiled exactly once by its tasks */
    for (int j = 0; j < d->mesh.ndev; j++) {
        int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS], need = 1, got = 0;
        xm_layout_block(d, j, lo, hi);
        for (int k = 0; k < nd; k++)
            need *= hi[k] - lo[k];
        for (int i = 0; i < ts->ntasks; i++)
            for (int h = 0; h < ts->tasks[i].nrecv; h++)
                if (ts->recvs[ts->tasks[i].recv_off + h] == d->mesh.devs[j])
                    got += xm_box_volume(&ts->tasks[i].box, nd);
        if (got != need)
            fail_msg("iter %d: dst device %d block of %lld elements got %lld", iter,
                     d->mesh.devs[j], (long long)need, (long long)got);
    }
    free(cover);
}

static void test_random_properties(void **state)
{
    (void)state;
    uint64_t seed = xt_seed("decompose_random");
    for (int it = 0; it < 3000; it++) {
        int nd = xt_range(&seed, 0, 4);
        int64_t shape[XM_MAX_DIMS];
        for (int k = 0; k < nd; k++)
            shape[k] = xt_range(&seed, 0, 9) == 0 ? xt_range(&seed, 0, 2) : xt_range(&seed, 1, 9);
        int an, bn, as[4], bs[4];
        random_mesh(&seed, &an, as, 24);
        random_mesh(&seed, &bn, bs, 24);
        int na = 1, nb = 1;
        for (int a = 0; a < an; a++)
            na *= as[a];
        for (int a = 0; a < bn; a++)
            nb *= bs[a];
        int adev[24], bdev[24];
        int overlap = xt_range(&seed, 0, 2) == 0;
        for (int i = 0; i < na; i++)
            adev[i] = i;
        for (int i = 0; i < nb; i++)
            bdev[i] = overlap ? (i * 7 + 3) % 24 : 24 + i;
        if (overlap) { /* distinct ids: a permutation of 0..23 restricted */
            for (int i = 0; i < nb; i++)
                bdev[i] = (i * 5 + 1) % 24;
        }
        char sspec[64], dspec[64];
        random_spec(&seed, nd, an, 1, sspec);
        random_spec(&seed, nd, bn, 0, dspec);
        xm_layout_t s, d;
        make_layout(&s, nd, shape, an, as, adev, sspec);
        make_layout(&d, nd, shape, bn, bs, bdev, dspec);
        s.split = xt_range(&seed, 0, 1) ? XMESH_SPLIT_TORCH : XMESH_SPLIT_NUMPY;
        d.split = xt_range(&seed, 0, 1) ? XMESH_SPLIT_TORCH : XMESH_SPLIT_NUMPY;
        xm_hostmap_t hm = {.ndev = 48, .nhosts = 48};
        int host[48];
        for (int i = 0; i < 48; i++)
            host[i] = i / xt_range(&seed, 1, 4);
        hm.host_of = host;
        xm_taskset_t ts;
        xmesh_result_t r = xm_decompose(&s, &d, xt_range(&seed, 0, 1) ? &hm : NULL, &ts);
        if (r)
            fail_msg("iter %d: %s (split %d) -> %s (split %d) failed: %s", it, sspec, s.split,
                     dspec, d.split, xmesh_last_error());
        check_invariants(&s, &d, &ts, it);
        xm_taskset_free(&ts);
    }
}

static void test_bad_pairs(void **state)
{
    (void)state;
    int64_t s1[2] = {4, 4}, s2[2] = {4, 5};
    int ms[1] = {2}, a[2] = {0, 1}, b[2] = {2, 3};
    xm_layout_t s, d;
    xm_taskset_t ts, before;
    memset(&ts, 0x33, sizeof ts);
    before = ts;
    make_layout(&s, 2, s1, 1, ms, a, "S0R");
    make_layout(&d, 2, s2, 1, ms, b, "S0R");
    assert_int_equal(xm_decompose(&s, &d, NULL, &ts), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "shape[1] = 4 != destination shape[1] = 5"));
    assert_memory_equal(&ts, &before, sizeof ts);
    make_layout(&d, 1, s1, 1, ms, b, "S0");
    assert_int_equal(xm_decompose(&s, &d, NULL, &ts), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "ndim 2 != destination ndim 1"));
    assert_memory_equal(&ts, &before, sizeof ts);
}

/* A shape whose byte size exceeds 64 bits is refused naming the shape (was
 * signed overflow in bytes_total); a zero dim makes any shape legal. */
static void test_shape_overflow(void **state)
{
    (void)state;
    int64_t big[2] = {(int64_t)1 << 31, (int64_t)1 << 31}; /* 2^62 elems x 4 B = 2^64 */
    int ms[1] = {2}, a[2] = {0, 1}, b[2] = {2, 3};
    xm_layout_t s, d;
    xm_taskset_t ts, before;
    memset(&ts, 0x33, sizeof ts);
    before = ts;
    make_layout(&s, 2, big, 1, ms, a, "S0R");
    make_layout(&d, 2, big, 1, ms, b, "RS0");
    assert_int_equal(xm_decompose(&s, &d, NULL, &ts), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "shape [2147483648, 2147483648]"));
    assert_non_null(strstr(xmesh_last_error(), "exceeds 64 bits"));
    assert_memory_equal(&ts, &before, sizeof ts);
    /* Half of it per dim fits: 4 x 2^30 x 2^30 = 2^62. */
    int64_t fits[2] = {(int64_t)1 << 30, (int64_t)1 << 30};
    make_layout(&s, 2, fits, 1, ms, a, "S0R");
    make_layout(&d, 2, fits, 1, ms, b, "RS0");
    assert_int_equal(xm_decompose(&s, &d, NULL, &ts), XMESH_SUCCESS);
    int64_t want = 4 * fits[0] * fits[1];
    assert_int_equal(ts.bytes_total, want);
    int64_t sum = 0;
    for (int t = 0; t < ts.ntasks; t++)
        sum += ts.tasks[t].bytes;
    assert_int_equal(sum, want);
    xm_taskset_free(&ts);
    /* Fits as a tensor, but its copies to 2 receiver hosts do not. */
    int64_t half[1] = {((int64_t)1 << 61) - 1}; /* x 4 B < 2^63, x 2 hosts > 2^63 */
    make_layout(&s, 1, half, 1, ms, a, "S0");
    make_layout(&d, 1, half, 1, ms, b, "R");
    memset(&ts, 0x33, sizeof ts);
    assert_int_equal(xm_decompose(&s, &d, NULL, &ts), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "receiver hosts exceed 64 bits"));
    assert_memory_equal(&ts, &before, sizeof ts);
    /* A zero dim: 0 bytes, but the other dims must still multiply within
     * 64 bits (blocks and boxes multiply extents before they meet the 0). */
    int64_t z[3] = {(int64_t)1 << 29, 0, (int64_t)1 << 29}; /* 8 x 2^58 = 2^61 */
    int64_t bytes = -1;
    assert_int_equal(xm_shape_bytes(3, z, 8, &bytes), XMESH_SUCCESS);
    assert_int_equal(bytes, 0);
    int64_t zbig[3] = {INT64_MAX, 0, INT64_MAX};
    assert_int_equal(xm_shape_bytes(3, zbig, 8, &bytes), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "[9223372036854775807, 0, 9223372036854775807]"));
    assert_int_equal(bytes, 0);
    int64_t m1[2] = {3, -1};
    assert_int_equal(xm_shape_bytes(2, m1, 8, &bytes), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "dim 1 = -1 is negative"));
    assert_int_equal(bytes, 0);
    int64_t edge[1] = {INT64_MAX / 8};
    assert_int_equal(xm_shape_bytes(1, edge, 8, &bytes), XMESH_SUCCESS);
    assert_int_equal(bytes, INT64_MAX / 8 * 8);
    edge[0]++;
    assert_int_equal(xm_shape_bytes(1, edge, 8, &bytes), XMESH_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_rule),        cmocka_unit_test(test_paper_fig2),
        cmocka_unit_test(test_table2_case4),      cmocka_unit_test(test_partial_groups),
        cmocka_unit_test(test_random_properties), cmocka_unit_test(test_bad_pairs),
        cmocka_unit_test(test_shape_overflow),    cmocka_unit_test(test_torch_split_rule),
        cmocka_unit_test(test_numpy_to_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
