/*
 * Flows: unit tasks grouped by where they come from and where they go, so
 * that the searches work on the host-level problem instead of the unit-task
 * one. Unit tasks grow with the product of both meshes' shard counts (an
 * RS01R -> S01RR boundary between two 64 x 8 meshes has 262,144 of them)
 * while the host-level problem does not (64 x 64 host pairs).
 *
 * Two tasks belong to the same flow when they have the same number of
 * partial groups, the same sorted set of NICs under the holders of every
 * group, the same sorted set of receiver NICs, and the same number of
 * receivers that already hold the box. A flow with k members and nopt
 * candidate sender hosts is cut into min(k, nopt) sub-flows of consecutive
 * members, so the sender choice keeps room to spread the flow's bytes.
 *
 * The flow task set is an ordinary xm_taskset_t whose task f copies the
 * holders and receivers of its first member (shared arrays, not copies) with
 * the summed bytes. Searches plan it; xm_flows_expand() turns a flow plan
 * into a unit-task plan (each flow's members back to back, in index order,
 * on the flow's sender host), which is then scored exactly by xm_step().
 */
#include <stdlib.h>
#include <string.h>

#include "xm_flows.h"

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* Canonical key of task t into buf (returns its length): ngroups, per group
 * the count and sorted unique NICs of its holders, the sorted unique receiver
 * NICs, the number of receivers that hold the box. */
static int task_key(const xm_prep_t *p, int t, int *buf)
{
    const xm_task_t *k = &p->ts->tasks[t];
    int n = 0;
    buf[n++] = k->ngroups;
    for (int g = 0; g < k->ngroups; g++) {
        int *cnt = &buf[n++], *s = buf + n;
        int m = 0;
        for (int j = 0; j < k->group_size; j++)
            s[m++] = p->dev_nic[p->ts->holders[k->holder_off + g * k->group_size + j]];
        qsort(s, (size_t)m, sizeof *s, cmp_int);
        int u = 0;
        for (int j = 0; j < m; j++)
            if (!u || s[u - 1] != s[j])
                s[u++] = s[j];
        *cnt = u;
        n += u;
    }
    int *cnt = &buf[n++], *s = buf + n, m = 0, self = 0;
    const unsigned char *is_holder = p->recv_is_holder + xm_pc(p, t)->recv_off;
    for (int i = 0; i < k->nrecv; i++) {
        s[m++] = p->dev_nic[p->ts->recvs[k->recv_off + i]];
        self += is_holder[i];
    }
    qsort(s, (size_t)m, sizeof *s, cmp_int);
    int u = 0;
    for (int j = 0; j < m; j++)
        if (!u || s[u - 1] != s[j])
            s[u++] = s[j];
    *cnt = u;
    n += u;
    buf[n++] = self;
    return n;
}

void xm_flows_free(xm_flows_t *f)
{
    if (!f)
        return;
    free(f->ts.tasks); /* holders and recvs belong to the unit task set */
    free(f->member_off);
    free(f->members);
    memset(f, 0, sizeof *f);
}

xmesh_result_t xm_flows_build(const xm_prep_t *p, xm_flows_t *out)
{
    const xm_taskset_t *ts = p->ts;
    int n = ts->ntasks;
    xm_flows_t f;
    memset(&f, 0, sizeof f);
    /* keys are made of the first task of each prep class (xm_prep_t.pc:
     * same NIC of every holder and receiver, so the same key) */
    int maxkey = 3;
    for (int c = 0; c < p->nklass; c++) {
        const xm_task_t *k = &ts->tasks[p->pc[c].rep];
        int len = 3 + k->ngroups * (1 + k->group_size) + k->nrecv;
        if (len > maxkey)
            maxkey = len;
    }
    /* keys are looked up once per prep class: size by classes, not tasks */
    size_t cap = 64;
    while (cap < 2 * (size_t)p->nklass)
        cap *= 2;
    int *slot = malloc(sizeof *slot * cap), *flow_of = malloc(sizeof(int) * (n + 1));
    int *key_off = malloc(sizeof(int) * (n + 2)), *rep = malloc(sizeof(int) * (n + 1));
    uint64_t *key_hash = malloc(sizeof *key_hash * (n + 1));
    int *cnt = calloc((size_t)n + 2, sizeof *cnt), *buf = malloc(sizeof(int) * maxkey);
    /* tasks of one class (xm_prep_t.pt[].klass: same NIC of every holder and
     * receiver) have the same key: computed once per class */
    int *flow_of_class = malloc(sizeof(int) * ((size_t)p->nklass + 1));
    int *keys = NULL;
    size_t keys_cap = 1024, keys_n = 0;
    keys = malloc(sizeof *keys * keys_cap);
    xmesh_result_t r = XMESH_SUCCESS;
    if (!slot || !flow_of || !key_off || !rep || !key_hash || !cnt || !buf || !keys ||
        !flow_of_class) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "flows: out of memory for %d tasks", n);
        goto out_free;
    }
    for (size_t i = 0; i < cap; i++)
        slot[i] = -1;
    for (int c = 0; c < p->nklass; c++)
        flow_of_class[c] = -1;
    /* 1. classes of equal keys (hash table over canonical keys), per prep
     * class: prep classes are numbered by first appearance, so key
     * classes are too, and the first task of a key class is the first of
     * a prep class */
    int nk = 0;
    for (int kc = 0; kc < p->nklass; kc++) {
        int t = p->pc[kc].rep;
        int len = task_key(p, t, buf);
        uint64_t h = 0x243f6a8885a308d3ull;
        for (int i = 0; i < len; i++)
            h = mix(h, (uint64_t)(unsigned)buf[i]);
        size_t s = (size_t)h & (cap - 1);
        int found = -1;
        while (slot[s] >= 0) {
            int c = slot[s];
            if (key_hash[c] == h && key_off[c + 1] - key_off[c] == len &&
                !memcmp(keys + key_off[c], buf, sizeof(int) * (size_t)len)) {
                found = c;
                break;
            }
            s = (s + 1) & (cap - 1);
        }
        if (found < 0) {
            if (keys_n + (size_t)len > keys_cap) {
                while (keys_n + (size_t)len > keys_cap)
                    keys_cap *= 2;
                int *nkeys = realloc(keys, sizeof *keys * keys_cap);
                if (!nkeys) {
                    r = XM_ERR(XMESH_ERR_NO_MEMORY, "flows: out of memory for %d tasks", n);
                    goto out_free;
                }
                keys = nkeys;
            }
            found = nk++;
            key_off[found] = (int)keys_n;
            memcpy(keys + keys_n, buf, sizeof(int) * (size_t)len);
            keys_n += (size_t)len;
            key_off[found + 1] = (int)keys_n;
            key_hash[found] = h;
            rep[found] = t;
            slot[s] = found;
        }
        flow_of_class[kc] = found;
        cnt[found] += p->pc[kc].ntasks;
    }
    /* 2. sub-flows: class c with cnt members and nopt options -> m pieces */
    int *sub_first = key_off; /* reuse: first sub-flow id of class c */
    int nf = 0;
    for (int c = 0; c < nk; c++) {
        int m = p->pt[rep[c]].nopt;
        if (m > cnt[c])
            m = cnt[c];
        if (m < 1)
            m = 1;
        sub_first[c] = nf;
        nf += m;
    }
    sub_first[nk] = nf;
    f.nflows = nf;
    f.member_off = calloc((size_t)nf + 2, sizeof(int));
    f.members = malloc(sizeof(int) * (n + 1));
    f.ts = *ts;
    f.ts.ntasks = nf;
    f.ts.tasks = malloc(sizeof(xm_task_t) * (nf + 1));
    if (!f.member_off || !f.members || !f.ts.tasks) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "flows: out of memory for %d flows", nf);
        goto out_free;
    }
    /* member i (in index order) of class c goes to sub-flow i * m / cnt;
     * a sub-flow's bytes are its members' (those of their prep class) */
    int *seen = calloc((size_t)nk + 1, sizeof *seen);
    int64_t *fbytes = calloc((size_t)nf + 1, sizeof *fbytes);
    if (!seen || !fbytes) {
        free(seen);
        free(fbytes);
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "flows: out of memory for %d flows", nf);
        goto out_free;
    }
    for (int t = 0; t < n; t++) {
        int kc = p->pt[t].klass;
        int c = flow_of_class[kc], m = sub_first[c + 1] - sub_first[c];
        int sub = sub_first[c] + (int)((int64_t)seen[c]++ * m / cnt[c]);
        flow_of[t] = sub;
        f.member_off[sub + 2]++;
        fbytes[sub] += ts->tasks[p->pc[kc].rep].bytes;
    }
    for (int i = 0; i < nf; i++)
        f.member_off[i + 2] += f.member_off[i + 1];
    for (int t = 0; t < n; t++)
        f.members[f.member_off[flow_of[t] + 1]++] = t;
    free(seen);
    for (int i = 0; i < nf; i++) {
        xm_task_t k = ts->tasks[f.members[f.member_off[i]]];
        k.bytes = fbytes[i];
        f.ts.tasks[i] = k;
    }
    free(fbytes);
    *out = f;
    memset(&f, 0, sizeof f);
out_free:
    xm_flows_free(&f);
    free(slot);
    free(flow_of);
    free(key_off);
    free(rep);
    free(key_hash);
    free(cnt);
    free(buf);
    free(keys);
    free(flow_of_class);
    return r;
}

void xm_flows_expand(const xm_flows_t *f, const int *forder, const int *fhosts, int *order,
                     int *hosts)
{
    int pos = 0;
    for (int i = 0; i < f->nflows; i++) {
        int fl = forder[i];
        for (int j = f->member_off[fl]; j < f->member_off[fl + 1]; j++) {
            int t = f->members[j];
            order[pos++] = t;
            hosts[t] = fhosts[fl];
        }
    }
}
