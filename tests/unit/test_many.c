/* Plans of many tensors, one process: the union decomposition
 * (xm_decompose_many: every tensor's unit tasks tagged with it, in one
 * device space; small tasks with the same holders and receivers packed
 * into shared tasks whose pieces cover each unit task exactly once), the
 * per-rank programs of a packed plan (every destination element of every
 * tensor covered once), and the API's refusals of bad input naming the
 * tensor index with nothing created, started or written (over an
 * in-process test backend, as tests/unit/test_api.c). Random cases print
 * their seed; XMESH_TEST_SEED replays. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "xm_api.h"
#include "xm_program.h"

/* ------------------------------------------------------ test backend */

static int start_calls;

static xmesh_result_t t_agree(xmesh_ctx_t ctx, xmesh_result_t local, uint64_t hash)
{
    (void)ctx;
    (void)hash;
    return local ? XMESH_ERR_REMOTE : XMESH_SUCCESS;
}
static xmesh_result_t t_setup(xmesh_plan_t p)
{
    (void)p;
    return XMESH_SUCCESS;
}
static void t_teardown(xmesh_plan_t p)
{
    (void)p;
}
typedef struct {
    xmesh_plan_t plan;
} t_req_t;
static xmesh_result_t t_start(xmesh_plan_t p, const void *const *s, void *const *d,
                              xmesh_request_t *req)
{
    (void)s;
    (void)d;
    t_req_t *r = calloc(1, sizeof *r);
    r->plan = p;
    p->inflight++;
    start_calls++;
    *req = (xmesh_request_t)r;
    return XMESH_SUCCESS;
}
static xmesh_result_t t_wait(xmesh_request_t req)
{
    t_req_t *r = (t_req_t *)req;
    r->plan->inflight--;
    free(r);
    return XMESH_SUCCESS;
}
static void t_free(xmesh_ctx_t ctx)
{
    (void)ctx;
}
static const xm_backend_ops_t test_ops = {"test", t_agree, t_setup, t_teardown, t_start,
                                          t_wait, t_wait,  t_free,  NULL,       1};

static xmesh_ctx_t make_ctx(int size, int per_host)
{
    xmesh_ctx_t c = calloc(1, sizeof *c);
    c->ops = &test_ops;
    c->size = size;
    c->hosts.ndev = size;
    c->hosts.host_of = malloc(sizeof(int) * size);
    for (int i = 0; i < size; i++)
        c->hosts.host_of[i] = i / per_host;
    c->hosts.nhosts = (size + per_host - 1) / per_host;
    return c;
}

static void expect_msg(const char *needle)
{
    if (!strstr(xmesh_last_error(), needle))
        fail_msg("message '%s' does not contain '%s'", xmesh_last_error(), needle);
}

/* ------------------------------------------------------ plain layouts */

static const int devs_a[4] = {0, 1, 2, 3}, devs_b[4] = {4, 5, 6, 7};

static xm_layout_t lay(int ndim, const int64_t *shape, size_t es, int mesh_ndim,
                       const int *mesh_shape, const int *devs, const char *spec)
{
    xm_layout_t l;
    memset(&l, 0, sizeof l);
    l.ndim = ndim;
    for (int d = 0; d < ndim; d++)
        l.shape[d] = shape[d];
    l.elem_size = es;
    l.mesh.ndim = mesh_ndim;
    l.mesh.ndev = 1;
    for (int a = 0; a < mesh_ndim; a++) {
        l.mesh.shape[a] = mesh_shape[a];
        l.mesh.ndev *= mesh_shape[a];
    }
    l.mesh.devs = devs;
    if (xm_spec_parse(spec, ndim, mesh_ndim, &l.spec))
        fail_msg("spec '%s': %s", spec, xmesh_last_error());
    return l;
}

static xm_hostmap_t hosts8(void)
{
    static int host_of[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    xm_hostmap_t h = {8, 4, host_of};
    return h;
}

/* Without packing the union is the tensors' task sets end to end, each
 * task tagged, holders and receivers as the tensor's own decomposition. */
static void test_union_tags(void **state)
{
    (void)state;
    int m4[1] = {4}, m22[2] = {2, 2};
    int64_t s0[2] = {8, 6}, s1[1] = {10}, s2[3] = {3, 4, 5};
    xm_layout_t src[3] = {lay(2, s0, 4, 1, m4, devs_a, "S0R"),
                          lay(1, s1, 2, 2, m22, devs_b, "S(0),B"),
                          lay(3, s2, 8, 1, m4, devs_a, "RRS0")};
    xm_layout_t dst[3] = {lay(2, s0, 4, 2, m22, devs_b, "S0S1"), lay(1, s1, 4, 1, m4, devs_a, "S0"),
                          lay(3, s2, 8, 2, m22, devs_a, "S1,S0,R")};
    xm_hostmap_t h = hosts8();
    xm_taskset_t u;
    assert_int_equal(xm_decompose_many(3, src, dst, NULL, &h, 0, 0, &u), XMESH_SUCCESS);
    assert_int_equal(u.ntensors, 3);
    assert_int_equal(u.npieces, 0);
    int t = 0;
    int64_t bytes = 0, cross = 0;
    for (int i = 0; i < 3; i++) {
        xm_taskset_t one;
        assert_int_equal(xm_decompose(&src[i], &dst[i], &h, &one), XMESH_SUCCESS);
        assert_int_equal(u.tmeta[i].ndim, src[i].ndim);
        assert_int_equal(u.tmeta[i].elem_size, one.elem_size);
        bytes += one.bytes_total;
        cross += one.bytes_cross_host;
        for (int k = 0; k < one.ntasks; k++, t++) {
            const xm_task_t *a = &one.tasks[k], *b = &u.tasks[t];
            assert_int_equal(b->tensor, i);
            assert_int_equal(b->npack, 0);
            assert_int_equal(b->bytes, a->bytes);
            assert_memory_equal(&b->box, &a->box, sizeof a->box);
            assert_int_equal(b->nrecv, a->nrecv);
            assert_int_equal(b->ngroups * b->group_size, a->ngroups * a->group_size);
            assert_memory_equal(u.recvs + b->recv_off, one.recvs + a->recv_off,
                                sizeof(int) * a->nrecv);
            assert_memory_equal(u.holders + b->holder_off, one.holders + a->holder_off,
                                sizeof(int) * a->ngroups * a->group_size);
            assert_int_equal(xm_task_ndim(&u, b), src[i].ndim);
        }
        xm_taskset_free(&one);
    }
    assert_int_equal(u.ntasks, t);
    assert_int_equal(u.bytes_total, bytes);
    assert_int_equal(u.bytes_cross_host, cross);
    xm_taskset_free(&u);
}

/* Marks which unit tasks of tensor i a piece or task covers: every element
 * of every tensor's boxes exactly once. */
static void cover(int *cnt, const int64_t *shape, int nd, const xm_box_t *b)
{
    int64_t n = 1, idx[XM_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        n *= b->hi[d] - b->lo[d];
        idx[d] = b->lo[d];
    }
    for (int64_t e = 0; e < n; e++) {
        int64_t g = 0;
        for (int d = 0; d < nd; d++)
            g = g * shape[d] + idx[d];
        cnt[g]++;
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < b->hi[d])
                break;
            idx[d] = b->lo[d];
        }
    }
}

/* 200 small tensors on the same pair of meshes (and a few on another pair,
 * a few of another dtype pair): the unit tasks with equal holders and
 * receivers are packed, at most pack_limit bytes each, and the pieces and
 * plain tasks cover every element of every tensor once. */
static void test_packing(void **state)
{
    (void)state;
    uint64_t seed = xt_seed("test_packing");
    enum { N = 200 };
    int m4[1] = {4}, m22[2] = {2, 2};
    xm_layout_t src[N], dst[N];
    int key[N];
    int64_t shapes[N][2];
    for (int i = 0; i < N; i++) {
        shapes[i][0] = xt_range(&seed, 0, 9);
        shapes[i][1] = xt_range(&seed, 1, 7);
        int other = i % 17 == 0, cvt = i % 13 == 0;
        src[i] = lay(2, shapes[i], 4, 1, m4, devs_a, other ? "RS0" : "S0R");
        dst[i] = lay(2, shapes[i], cvt ? 2 : 4, 2, m22, devs_b, "S(0),B");
        key[i] = cvt;
    }
    xm_hostmap_t h = hosts8();
    xm_taskset_t plain, u;
    assert_int_equal(xm_decompose_many(N, src, dst, key, &h, 0, 0, &plain), XMESH_SUCCESS);
    const int64_t limit = 600;
    assert_int_equal(xm_decompose_many(N, src, dst, key, &h, 1 << 20, limit, &u), XMESH_SUCCESS);
    assert_true(u.ntasks < plain.ntasks / 4);
    assert_int_equal(u.bytes_total, plain.bytes_total);
    assert_int_equal(u.bytes_cross_host, plain.bytes_cross_host);
    int **cnt = calloc(N, sizeof *cnt);
    for (int i = 0; i < N; i++)
        cnt[i] = calloc((size_t)(shapes[i][0] * shapes[i][1] + 1), sizeof(int));
    int units = 0;
    for (int t = 0; t < u.ntasks; t++) {
        const xm_task_t *k = &u.tasks[t];
        if (!k->npack) {
            cover(cnt[k->tensor], shapes[k->tensor], 2, &k->box);
            units++;
            continue;
        }
        assert_int_equal(k->tensor, -1);
        assert_true(k->npack >= 2);
        assert_true(k->bytes <= limit);
        assert_int_equal(xm_task_ndim(&u, k), 1);
        int64_t off = 0, bytes = 0;
        int kk = key[u.pieces[k->pack_off].tensor];
        for (int q = 0; q < k->npack; q++) {
            const xm_piece_t *pc = &u.pieces[k->pack_off + q];
            assert_int_equal(pc->off, off); /* end to end */
            assert_int_equal(pc->n, xm_box_volume(&pc->box, 2));
            assert_int_equal(key[pc->tensor], kk); /* one dtype pair per packed task */
            off += pc->n;
            bytes += pc->n * (int64_t)u.tmeta[pc->tensor].elem_size;
            cover(cnt[pc->tensor], shapes[pc->tensor], 2, &pc->box);
            units++;
            /* every piece's own decomposition has a unit task with the
             * packed task's receivers and holder set */
            xm_taskset_t one;
            assert_int_equal(xm_decompose(&src[pc->tensor], &dst[pc->tensor], &h, &one),
                             XMESH_SUCCESS);
            int found = 0;
            for (int j = 0; j < one.ntasks && !found; j++)
                found = !memcmp(&one.tasks[j].box, &pc->box, sizeof pc->box) &&
                        one.tasks[j].nrecv == k->nrecv &&
                        !memcmp(one.recvs + one.tasks[j].recv_off, u.recvs + k->recv_off,
                                sizeof(int) * k->nrecv);
            assert_true(found);
            xm_taskset_free(&one);
        }
        assert_int_equal(k->box.lo[0], 0);
        assert_int_equal(k->box.hi[0], off);
        assert_int_equal(k->bytes, bytes);
    }
    assert_int_equal(units, plain.ntasks);
    for (int i = 0; i < N; i++) {
        for (int64_t g = 0; g < shapes[i][0] * shapes[i][1]; g++)
            if (cnt[i][g] != 1)
                fail_msg("tensor %d element %lld covered %d times", i, (long long)g, cnt[i][g]);
        free(cnt[i]);
    }
    free(cnt);
    xm_taskset_free(&plain);
    xm_taskset_free(&u);
}

/* A bad pair is refused naming its tensor index; nothing is returned. */
static void test_union_bad_pair(void **state)
{
    (void)state;
    int m4[1] = {4};
    int64_t a[2] = {8, 6}, b[2] = {8, 7};
    xm_layout_t src[3] = {lay(2, a, 4, 1, m4, devs_a, "S0R"), lay(2, a, 4, 1, m4, devs_a, "S0R"),
                          lay(2, a, 4, 1, m4, devs_a, "S0R")};
    xm_layout_t dst[3] = {lay(2, a, 4, 1, m4, devs_b, "RS0"), lay(2, a, 4, 1, m4, devs_b, "RS0"),
                          lay(2, b, 4, 1, m4, devs_b, "RS0")};
    xm_hostmap_t h = hosts8();
    xm_taskset_t u;
    memset(&u, 0x5a, sizeof u);
    xm_taskset_t keep = u;
    assert_int_equal(xm_decompose_many(3, src, dst, NULL, &h, 1 << 20, 0, &u),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("tensor 2: ");
    assert_memory_equal(&u, &keep, sizeof u);
}

/* The per-rank programs of a packed union: every destination element of
 * every tensor is written by exactly one op of one rank (a COPY or an
 * UNPACK), and packed steps' pieces lie inside the rank's blocks. */
static void test_program_pieces(void **state)
{
    (void)state;
    enum { N = 40 };
    int m4[1] = {4}, m22[2] = {2, 2};
    xm_layout_t src[N], dst[N];
    int64_t shapes[N][2];
    xmesh_dtype_t dt[N];
    for (int i = 0; i < N; i++) {
        shapes[i][0] = 2 + i % 5;
        shapes[i][1] = 3;
        src[i] = lay(2, shapes[i], 4, 1, m4, devs_a, i % 3 ? "S0R" : "RR");
        dst[i] = lay(2, shapes[i], 4, 2, m22, i % 2 ? devs_b : devs_a, "S(1),S(0)");
        dt[i] = XMESH_F32;
    }
    xm_hostmap_t h = hosts8();
    xm_taskset_t u;
    assert_int_equal(xm_decompose_many(N, src, dst, NULL, &h, 1 << 20, 0, &u), XMESH_SUCCESS);
    assert_true(u.npieces > 0);
    xm_cluster_t cl;
    assert_int_equal(xm_cluster_init(&cl, &h), XMESH_SUCCESS);
    cl.chunk_bytes = 64; /* chunks cross piece boundaries */
    xm_sched_opts_t so = {.kind = XMESH_SCHEDULER_GREEDY, .max_evals = 2000, .seed = 1};
    xm_schedule_t sc;
    assert_int_equal(xm_schedule(&u, &cl, &so, &sc), XMESH_SUCCESS);
    xm_prog_in_t in = {.ts = &u,
                       .sched = &sc,
                       .hosts = &h,
                       .src = &src[0],
                       .dst = &dst[0],
                       .strategy = XMESH_STRATEGY_BROADCAST,
                       .dtype = XMESH_F32,
                       .dst_dtype = XMESH_F32,
                       .chunk_bytes = 64,
                       .ntensors = N,
                       .srcs = src,
                       .dsts = dst,
                       .dtypes = dt,
                       .dst_dtypes = dt};
    xm_chains_t ch;
    assert_int_equal(xm_chains_build(&in, &ch), XMESH_SUCCESS);
    int **cnt = calloc(N, sizeof *cnt);
    for (int i = 0; i < N; i++)
        cnt[i] = calloc((size_t)(shapes[i][0] * shapes[i][1]), sizeof(int));
    int packed_steps = 0;
    for (int rank = 0; rank < 8; rank++) {
        xm_program_t p;
        assert_int_equal(xm_program_build(&in, &ch, rank, &p), XMESH_SUCCESS);
        for (int k = 0; k < p.nsteps; k++) {
            const xm_pstep_t *s = &p.steps[k];
            int writes = 0;
            for (int o = 0; o < s->nops; o++)
                writes |= s->ops[o].kind == XM_POP_UNPACK || s->ops[o].kind == XM_POP_COPY;
            packed_steps += s->npieces > 0;
            /* chunks cover the step's range once */
            int64_t covered = 0;
            for (int64_t c = 0; c < s->nchunks; c++) {
                int64_t a, cn;
                xm_pstep_chunk(s, c, &a, &cn);
                covered += cn;
            }
            const xm_task_t *tk = &u.tasks[s->task];
            assert_int_equal(covered, xm_box_volume(&tk->box, xm_task_ndim(&u, tk)));
            if (!writes)
                continue;
            if (!s->npieces) {
                cover(cnt[s->tensor], shapes[s->tensor], 2, &tk->box);
                continue;
            }
            for (int q = 0; q < s->npieces; q++) {
                const xm_ppiece_t *pc = &p.pieces[s->piece_off + q];
                const xm_piece_t *tp = &u.pieces[tk->pack_off + q];
                assert_int_equal(pc->tensor, tp->tensor);
                assert_true(pc->has_dg);
                cover(cnt[pc->tensor], shapes[pc->tensor], 2, &tp->box);
                /* the piece lookup finds it from any of its elements */
                assert_ptr_equal(xm_pstep_piece_first(&p, s, pc->off + pc->n - 1), pc);
            }
        }
        xm_program_free(&p);
    }
    assert_true(packed_steps > 0);
    for (int i = 0; i < N; i++) {
        for (int64_t g = 0; g < shapes[i][0] * shapes[i][1]; g++)
            if (cnt[i][g] != 1)
                fail_msg("tensor %d element %lld written %d times", i, (long long)g, cnt[i][g]);
        free(cnt[i]);
    }
    free(cnt);
    xm_chains_free(&ch);
    xm_schedule_free(&sc);
    xm_cluster_free(&cl);
    xm_taskset_free(&u);
}

/* ------------------------------------------------------------ the API */

/* Bad input to xmesh_plan_create_many and xmesh_reshard_many: refused
 * naming the value and the tensor index; *out untouched, nothing
 * started, no plan or mesh reference left behind. */
static void test_api_refusals(void **state)
{
    (void)state;
    xmesh_ctx_t ctx = make_ctx(8, 2);
    int shape[1] = {4};
    xmesh_mesh_t ma, mb;
    assert_int_equal(xmesh_mesh_create(ctx, 1, shape, devs_a, &ma), XMESH_SUCCESS);
    assert_int_equal(xmesh_mesh_create(ctx, 1, shape, devs_b, &mb), XMESH_SUCCESS);
    int64_t t0[2] = {8, 4}, t1[1] = {6}, t2[2] = {3, 3};
    xmesh_layout_t src[3] = {
        {2, t0, XMESH_F32, ma, "S0R"}, {1, t1, XMESH_BF16, mb, "B"}, {2, t2, XMESH_I32, ma, "RS0"}};
    xmesh_layout_t dst[3] = {
        {2, t0, XMESH_F32, mb, "RS0"}, {1, t1, XMESH_F32, ma, "S0"}, {2, t2, XMESH_I32, mb, "S0R"}};
    xmesh_plan_t plan = (xmesh_plan_t)0x77, keep = plan;
    assert_int_equal(xmesh_plan_create_many(ctx, 0, src, dst, NULL, &plan),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("n = 0");
    assert_int_equal(xmesh_plan_create_many(ctx, -3, src, dst, NULL, &plan),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("n = -3");
    assert_int_equal(xmesh_plan_create_many(ctx, 3, NULL, dst, NULL, &plan),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("source layout array is NULL");
    assert_int_equal(xmesh_plan_create_many(ctx, 3, src, NULL, NULL, &plan),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("destination layout array is NULL");
    /* a bad layout at index 2, and an unconvertible dtype pair at index 1 */
    src[2].sharding = "S0S0";
    assert_int_equal(xmesh_plan_create_many(ctx, 3, src, dst, NULL, &plan),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("tensor 2: ");
    src[2].sharding = "RS0";
    src[1].dtype = XMESH_I32;
    assert_int_equal(xmesh_plan_create_many(ctx, 3, src, dst, NULL, &plan),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("tensor 1: source dtype i32 != destination dtype f32");
    src[1].dtype = XMESH_BF16;
    int64_t bad1[1] = {7};
    dst[1].shape = bad1;
    assert_int_equal(xmesh_plan_create_many(ctx, 3, src, dst, NULL, &plan),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("tensor 1: ");
    dst[1].shape = t1;
    dst[0].mesh = NULL;
    assert_int_equal(xmesh_plan_create_many(ctx, 3, src, dst, NULL, &plan),
                     XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("tensor 0: destination layout: mesh is NULL");
    dst[0].mesh = mb;
    assert_ptr_equal(plan, keep);
    assert_int_equal(ctx->nplans, 0);
    assert_int_equal(ma->nplans, 0);
    assert_int_equal(mb->nplans, 0);

    /* a good plan: info sums; meshes referenced once per use */
    assert_int_equal(xmesh_plan_create_many(ctx, 3, src, dst, NULL, &plan), XMESH_SUCCESS);
    assert_int_equal(ma->nplans, 3);
    assert_int_equal(mb->nplans, 3);
    xmesh_plan_info_t info;
    assert_int_equal(xmesh_plan_get_info(plan, &info), XMESH_SUCCESS);
    assert_int_equal(info.tensors, 3);
    assert_int_equal(info.bytes_total, 8 * 4 * 4 + 6 * 2 + 9 * 4);
    assert_true(info.lower_bound_s > 0);
    assert_true(info.predicted_s >= info.lower_bound_s * (1 - 1e-9));
    assert_int_equal(xmesh_mesh_destroy(ma), XMESH_ERR_INVALID_USAGE);

    /* rank 0 holds a source block of tensors 0 and 2, a destination
     * block of tensor 1: NULL there is refused naming the index */
    float b0[8], d1[2];
    int32_t b2[3];
    const void *srcs[3] = {b0, NULL, b2};
    void *dsts[3] = {NULL, d1, NULL};
    xmesh_request_t req = (xmesh_request_t)0x99, rkeep = req;
    srcs[2] = NULL;
    assert_int_equal(xmesh_reshard_many_start(plan, srcs, dsts, &req), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("tensor 2: src_locals[2] is NULL but rank 0 holds a source block");
    srcs[2] = b2;
    dsts[1] = NULL;
    assert_int_equal(xmesh_reshard_many(plan, srcs, dsts), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("tensor 1: dst_locals[1] is NULL but rank 0 holds a destination block");
    dsts[1] = b0; /* tensor 1's destination is tensor 0's source */
    assert_int_equal(xmesh_reshard_many(plan, srcs, dsts), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("tensor 1: dst_locals[1]");
    dsts[1] = d1;
    assert_int_equal(xmesh_reshard_many_start(plan, NULL, dsts, &req), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("src_locals is NULL");
    assert_int_equal(xmesh_reshard_many_start(plan, srcs, NULL, &req), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("dst_locals is NULL");
    /* the one-block entry points refuse a plan of many */
    assert_int_equal(xmesh_reshard(plan, b0, d1), XMESH_ERR_INVALID_USAGE);
    expect_msg("3 tensors");
    assert_ptr_equal(req, rkeep);
    assert_int_equal(start_calls, 0);
    assert_int_equal(xmesh_reshard_many(plan, srcs, dsts), XMESH_SUCCESS);
    assert_int_equal(start_calls, 1);
    assert_int_equal(xmesh_plan_destroy(plan), XMESH_SUCCESS);
    assert_int_equal(ma->nplans, 0);
    assert_int_equal(mb->nplans, 0);

    /* a plan of one through either entry point is the same plan */
    xmesh_plan_t p1, p2;
    assert_int_equal(xmesh_plan_create(ctx, &src[0], &dst[0], NULL, &p1), XMESH_SUCCESS);
    assert_int_equal(xmesh_plan_create_many(ctx, 1, &src[0], &dst[0], NULL, &p2), XMESH_SUCCESS);
    xmesh_plan_info_t i1, i2;
    xmesh_plan_get_info(p1, &i1);
    xmesh_plan_get_info(p2, &i2);
    assert_int_equal(i1.tensors, 1);
    assert_int_equal(i1.unit_tasks, i2.unit_tasks);
    assert_int_equal(i1.bytes_total, i2.bytes_total);
    assert_true(i1.predicted_s == i2.predicted_s);
    const void *one_src[1] = {b0};
    void *one_dst[1] = {NULL};
    assert_int_equal(xmesh_reshard_many(p1, one_src, one_dst), XMESH_SUCCESS);
    assert_int_equal(xmesh_reshard(p2, b0, NULL), XMESH_SUCCESS);
    assert_int_equal(xmesh_reshard(p2, NULL, NULL), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("src_local is NULL but rank 0 holds a source block");
    xmesh_plan_destroy(p1);
    xmesh_plan_destroy(p2);
    assert_int_equal(xmesh_mesh_destroy(ma), XMESH_SUCCESS);
    assert_int_equal(xmesh_mesh_destroy(mb), XMESH_SUCCESS);
    assert_int_equal(xmesh_ctx_destroy(ctx), XMESH_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_union_tags),     cmocka_unit_test(test_packing),
        cmocka_unit_test(test_union_bad_pair), cmocka_unit_test(test_program_pieces),
        cmocka_unit_test(test_api_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
