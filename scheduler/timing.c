/*
 * Rails and timing of a task's routes (paper 002, section 3.1 eq. 1-3):
 * which NIC index (rail) every hop between hosts takes, and the pipelined
 * chain time with the NIC directions each hop holds. The list-scheduling
 * step (routes.c) and the simulator (simulate.c) both time routes here, so
 * a plan scored during search is the plan simulated.
 */
#include <math.h>

#include "xm_sched_impl.h"

static double hop_bw(const xm_cluster_t *c)
{
    return c->nic_send_Bps < c->nic_recv_Bps ? c->nic_send_Bps : c->nic_recv_Bps;
}

/* ------------------------------------------------------------ rails */

void xm_route_rails(const xm_prep_t *p, const xm_state_t *s, xm_troutes_t *r)
{
    int K = p->nics;
    for (int q = 0; q < r->nroutes; q++) {
        const xm_route_t *rt = &r->routes[q];
        const int *d = r->devs + rt->off;
        int *rl = r->rails + rt->off;
        for (int i = 0; i < rt->len; i++) {
            rl[i] = -1;
            if (i + 1 == rt->len)
                break;
            int ha = p->dev_host[d[i]], hb = p->dev_host[d[i + 1]];
            if (ha == hb)
                continue;
            int ra = p->dev_nic[d[i]] % K, rb = p->dev_nic[d[i + 1]] % K;
            rl[i] = ra;
            if (ra == rb)
                continue;
            int oka = p->nic_ok[hb * K + ra], okb = p->nic_ok[ha * K + rb];
            if (okb && !oka) {
                rl[i] = rb;
            } else if (oka && okb) {
                double fa = s->dir_free[XM_DIR_SEND(ha * K + ra)],
                       fb = s->dir_free[XM_DIR_SEND(ha * K + rb)];
                double ga = s->dir_free[XM_DIR_RECV(hb * K + ra)],
                       gb = s->dir_free[XM_DIR_RECV(hb * K + rb)];
                if ((fb > gb ? fb : gb) < (fa > ga ? fa : ga))
                    rl[i] = rb;
            }
        }
    }
}

/* ----------------------------------------------------------- timing */

static inline void use_dir(xm_troutes_t *r, int dir, double t0, double t1)
{
    for (int i = 0; i < r->nuse; i++)
        if (r->use_dir[i] == dir) {
            r->use_count[i]++;
            if (t0 < r->use_off[i])
                r->use_off[i] = t0;
            if (t1 > r->use_end[i])
                r->use_end[i] = t1;
            return;
        }
    r->use_dir[r->nuse] = dir;
    r->use_off[r->nuse] = t0;
    r->use_end[r->nuse] = t1;
    r->use_count[r->nuse++] = 1;
}

/* Alpha-beta pipelined chain (paper 3.1, T^bc = t + A t / K): the bytes go
 * in K chunks of c = B / K; every hop costs latency + a c / bw for its first
 * window, where a = xm_hop_fill() chunks share the hop's wire and arrive
 * together (the executor keeps send_ahead sends in flight per hop, and
 * forward_ahead on a hop between hosts with one upstream, whose chunks
 * arrive paced by that NIC), then the slowest hop
 * paces the remaining K - a0 chunks (a0: the first hop's window). (Pacing K - 1 after a window
 * of a counted a - 1 chunks twice: with send-ahead 2, a task of 2 chunks was
 * modelled 1.5x its wire time, above the measured time, so the "lower bound"
 * of n-to-m case 4 read 0.671 s against 0.468 s measured.)
 *
 * NIC occupancy (docs/LOWER_BOUND.md, model fact 1): hop h of a chain holds
 * its NIC directions from the fill of the hops before it, off_h = sum_{j<h}
 * (latency + a_j c / bw_j), to its last chunk, off_h + latency + a_h c / bw_h
 * + (K - a0) c / min_{j<=h} bw_j, and at least latency + B / hop_bw (its own
 * bytes at the hop's speed); a direction crossed n times holds from its
 * earliest hop's start for at least latency + n B / bw. Outside that interval
 * other tasks may use the direction, as the executor's send-ahead windows let
 * consecutive chains overlap on a NIC; the whole chain's duration D_t is only
 * the task's end. (Holding every direction for D_t charged every hop the fill
 * of the whole chain: a 2-chunk task on a 2-hop chain took 3 chunk times per
 * NIC instead of 2, so the "lower bound" of GPT-2 FSDP -> TP-4 on 300 Mbit/s
 * NICs read 8.03 s against 6.84 s measured.) */
void xm_task_timing(const xm_prep_t *p, int t, xm_troutes_t *r)
{
    const xm_cluster_t *c = p->c;
    const xm_task_t *k = &p->ts->tasks[t];
    double B = (double)k->bytes;
    int64_t C = c->chunk_bytes > 0 ? c->chunk_bytes : (int64_t)1 << 20;
    int64_t K = (k->bytes + C - 1) / C;
    if (K < 1)
        K = 1;
    double ch = B / (double)K, inter = hop_bw(c), dur = 0;
    r->nuse = 0;
    for (int q = 0; q < r->nroutes; q++) {
        const xm_route_t *rt = &r->routes[q];
        const int *d = r->devs + rt->off;
        double T;
        if (rt->len <= 1) {
            T = c->latency_s + B / c->intra_Bps; /* self copy: a local memcpy */
        } else {
            double sum = 0, bmin = INFINITY, fill0 = 1;
            int prev_x = 0;
            for (int h = 0; h + 1 < rt->len; h++) {
                double bw = c->intra_Bps;
                int x = p->dev_host[d[h]] != p->dev_host[d[h + 1]];
                if (x)
                    bw = inter;
                double fill = xm_hop_fill_inline(c, K, prev_x, x);
                if (h == 0)
                    fill0 = fill;
                double off = sum;
                sum += c->latency_s + fill * ch / bw;
                if (bw < bmin)
                    bmin = bw;
                if (x) {
                    double e = sum + ((double)K - fill0) * ch / bmin;
                    if (e < off + c->latency_s + B / inter)
                        e = off + c->latency_s + B / inter;
                    int rail = r->rails ? r->rails[rt->off + h] : -1;
                    if (rail >= 0) { /* the rail's NIC on both hosts */
                        use_dir(r, XM_DIR_SEND(p->dev_host[d[h]] * p->nics + rail), off, e);
                        use_dir(r, XM_DIR_RECV(p->dev_host[d[h + 1]] * p->nics + rail), off, e);
                    } else {
                        use_dir(r, XM_DIR_SEND(p->dev_nic[d[h]]), off, e);
                        use_dir(r, XM_DIR_RECV(p->dev_nic[d[h + 1]]), off, e);
                    }
                }
                prev_x |= x; /* a hop between hosts upstream paces the rest */
            }
            T = sum + ((double)K - fill0) * ch / bmin;
        }
        if (T > dur)
            dur = T;
    }
    r->route_dur = dur;
    /* A NIC direction crossed n times inside the task carries n * B bytes. */
    for (int i = 0; i < r->nuse; i++) {
        double bw = (r->use_dir[i] & 1) ? c->nic_recv_Bps : c->nic_send_Bps;
        double e = r->use_off[i] + r->use_count[i] * B / bw + c->latency_s;
        if (e > r->use_end[i])
            r->use_end[i] = e;
        if (r->use_end[i] > dur)
            dur = r->use_end[i];
    }
    r->dur = dur;
}
