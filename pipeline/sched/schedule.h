/*
 * Pipeline schedules as data (pure C: no MPI, no xmesh calls).
 *
 * A schedule lists, for each pipeline stage, the actions every rank of that
 * stage runs in order during one training step. Stages are connected by a
 * stage graph: edges (src stage -> dst stage), possibly between NON-adjacent
 * stages (skip connections, U-Transformer). Each edge carries one tensor per
 * microbatch in two directions: the forward activation (dir A, src -> dst)
 * and the backward gradient (dir G, dst -> src). Each (edge, dir) pair is one
 * xmesh plan in the driver, and a plan has ONE request in flight per rank: the
 * transfers of one (edge, dir) run one after another in the order they were
 * started, and both endpoint stages start them in the same (microbatch) order.
 *
 * Actions and their text form (the grammar, one token per action):
 *
 *   F<m>          forward of microbatch m
 *   B<m>          full backward of m (input and weight gradients)
 *   I<m>          input-gradient half of the backward of m (zero-bubble "B")
 *   W<m>          weight-gradient half of the backward of m (needs I<m> first)
 *   SA<m>.e<k>    start the activation transfer of m on edge k (the producer:
 *                 send; the consumer: post the receive)
 *   WA<m>.e<k>    wait until that transfer completed on this rank
 *   SG<m>.e<k>    start the gradient transfer of m on edge k (dst -> src)
 *   WG<m>.e<k>    wait for it
 *   R             reduce gradients (data parallel inside the stage)
 *   O             optimizer step
 *
 * A start is a non-blocking "enqueue": it is issued on the plan as soon as the
 * plan's previous transfer (in start order) has completed. A wait blocks until
 * the transfer of that microbatch has completed; a transfer completes when
 * both endpoint stages started it and the previous transfer of the plan
 * completed (plus its transfer time in the timed simulator).
 *
 * Virtual stages: a rank group (mesh) may hold several model stages ("chunks"); then the
 * schedule has one action list per GROUP, stage_group maps each model stage to its group, and
 * every compute and transfer action names its chunk (the index of its stage among the
 * group's stages, in increasing stage order) with a ".c<k>" suffix when k > 0:
 *   F3.c1         forward of microbatch 3 on the group's second stage
 *   SA3.e2.c1     the transfer of edge 2 as seen by the group's second stage (when both
 *                 stages of edge 2 sit on this group, both sides appear in its list)
 * Without virtual stages ngroups == nstages, group g holds stage g and nothing changes.
 *
 * Whole schedule (xmp_sched_format / xmp_sched_parse):
 *
 *   schedule  := header "\n" { stageline "\n" }
 *   header    := "schedule" SP name SP "S=" int SP "M=" int SP "edges=" edges
 *                [ SP "groups=" int SP "map=" int { "," int } ]   (virtual stages: S entries)
 *                [ SP "recompute=" ( "none" | "block" | "selective:" fraction ) ]
 *   edges     := "-" | edge { "," edge }          ("-": no edges)
 *   edge      := int ">" int     (source stage ">" destination stage; edge ids 0,1,.. in order)
 *   stageline := ("s" | "g") int SP "inflight<=" int ":" { SP action }   (the group's list;
 *                written "g" when the schedule has virtual stages)
 *   name      := non-blank characters, at most XMP_SCHED_NAME_MAX - 1
 *
 * Blank lines and lines starting with '#' are ignored. Example (S=2, M=2, 1F1B):
 *
 *   schedule 1f1b S=2 M=2 edges=0>1
 *   s0 inflight<=2: SG0.e0 F0 SA0.e0 F1 SA1.e0 WA0.e0 WG0.e0 SG1.e0 B0 ...
 *
 * Ownership: an xmp_schedule_t is created by xmp_sched_create / a generator /
 * xmp_sched_parse and freed by xmp_sched_destroy (NULL is a no-op). Functions
 * that take `char *err, size_t errlen` write a message naming the bad value on
 * failure (err may be NULL) and return -1; they return 0 on success and leave
 * their outputs untouched on failure.
 */
#ifndef XMP_SCHEDULE_H
#define XMP_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_SCHED_NAME_MAX 32

typedef enum {
    XMP_ACT_F = 0,
    XMP_ACT_B = 1,
    XMP_ACT_I = 2,
    XMP_ACT_W = 3,
    XMP_ACT_START = 4, /* transfer start (edge, dir, mb) */
    XMP_ACT_WAIT = 5,  /* transfer wait (edge, dir, mb) */
    XMP_ACT_R = 6,
    XMP_ACT_O = 7
} xmp_act_kind_t;

typedef enum { XMP_DIR_ACT = 0, XMP_DIR_GRAD = 1 } xmp_dir_t;

typedef struct {
    int kind;  /* xmp_act_kind_t */
    int mb;    /* microbatch; -1 for R and O */
    int edge;  /* edge id for START/WAIT, else -1 */
    int dir;   /* xmp_dir_t for START/WAIT, else 0 */
    int chunk; /* which of the group's stages (0: its lowest model stage, 1: the next, ...);
                * for START/WAIT the endpoint of the edge on this group (tells the sides of
                * an edge whose both stages sit on one group apart); always 0 with one stage
                * per group. R and O: 0 */
} xmp_action_t;

typedef struct {
    int src, dst; /* stages; the activation flows src -> dst */
} xmp_sedge_t;

typedef enum {
    XMP_RECOMPUTE_NONE = 0,
    XMP_RECOMPUTE_BLOCK = 1,    /* whole chunk forward recomputed before its backward */
    XMP_RECOMPUTE_SELECTIVE = 2 /* only the attention internals (a fraction of the forward) */
} xmp_recompute_t;
/* "none", "block", "selective"; -1 if unknown. */
int xmp_recompute_parse(const char *name);
const char *xmp_recompute_name(int mode);

typedef struct {
    char name[XMP_SCHED_NAME_MAX];
    int nstages, nmb, nedges; /* nstages: MODEL stages (chunks), the nodes of the stage graph */
    xmp_sedge_t *edges;       /* nedges */
    /* Action lists, one per rank group (mesh). Without virtual stages ngroups == nstages and
     * group g holds stage g, so "per group" below is "per stage". */
    int *len;              /* per group: number of actions */
    int *cap;              /* per group: allocated actions (internal) */
    xmp_action_t **acts;   /* per group */
    int *max_inflight;     /* per group: bound on (chunk, microbatch) pairs with F done and
                            * B/I not done, summed over the group's chunks */
    int ngroups;           /* rank groups */
    int *stage_group;      /* nstages: the group that holds each model stage */
    int *nchunks;          /* ngroups: stages per group */
    int **group_stage;     /* [g][c]: model stage of chunk c of group g, increasing in c */
    int recompute;         /* xmp_recompute_t: every backward (B or I) of a chunk is preceded
                            * by recomputing recompute_frac of its forward */
    double recompute_frac; /* block: 1; selective: the caller's fraction (0..1) */
} xmp_schedule_t;

/* Model stage that action a of group g's list belongs to (chunk -> stage). */
static inline int xmp_action_stage(const xmp_schedule_t *s, int g, xmp_action_t a)
{
    return s->group_stage[g][a.chunk];
}
/* Chunk index of model stage st on its group. */
static inline int xmp_stage_chunk(const xmp_schedule_t *s, int st)
{
    int g = s->stage_group[st], c = 0;
    while (s->group_stage[g][c] != st)
        c++;
    return c;
}
/* 1 when some group holds more than one stage or the map is not the identity. */
int xmp_sched_is_virtual(const xmp_schedule_t *s);

/* (edge, dir) -> plan index 2*edge + dir, used by the simulator's transfer arrays. */
static inline int xmp_plan_index(int edge, int dir)
{
    return 2 * edge + dir;
}
/* The stage that starts the transfer as sender / receiver for (edge, dir). */
static inline int xmp_xfer_sender(const xmp_schedule_t *s, int edge, int dir)
{
    return dir == XMP_DIR_ACT ? s->edges[edge].src : s->edges[edge].dst;
}
static inline int xmp_xfer_receiver(const xmp_schedule_t *s, int edge, int dir)
{
    return dir == XMP_DIR_ACT ? s->edges[edge].dst : s->edges[edge].src;
}

/* Empty schedule: nstages >= 1, nmb >= 1, edges copied (src, dst in range,
 * src != dst). max_inflight starts at nmb. One stage per group (identity map). */
int xmp_sched_create(int nstages, int nmb, int nedges, const xmp_sedge_t *edges,
                     xmp_schedule_t **out, char *err, size_t errlen);
/* Empty schedule with virtual stages: stage_group[st] in 0..ngroups-1 for each of the
 * nstages model stages, every group holds at least one stage (NULL: identity, ngroups must
 * equal nstages). max_inflight starts at nmb * (the group's chunks). */
int xmp_sched_create_virtual(int nstages, int ngroups, const int *stage_group, int nmb, int nedges,
                             const xmp_sedge_t *edges, xmp_schedule_t **out, char *err,
                             size_t errlen);
/* Megatron's interleaving: stage c*R + r is chunk c of group r (R*V entries). */
void xmp_sched_interleaved_map(int R, int V, int *stage_group);
/* V shape: group r holds stages r and 2R-1-r (2R entries). */
void xmp_sched_vshape_map(int R, int *stage_group);
/* A stage -> group map from text (a CLI's --stage-groups): "interleaved" (Megatron's, needs
 * nstages a multiple of ngroups), "v" (needs nstages == 2 ngroups) or a comma list of nstages
 * group ids, every group 0..ngroups-1 used. Writes nstages entries; 0, or -1 with a message
 * naming the bad value (stage_group untouched). */
int xmp_sched_parse_map(const char *text, int nstages, int ngroups, int *stage_group, char *err,
                        size_t errlen);
void xmp_sched_destroy(xmp_schedule_t *s);
/* Appends one action to a stage's list (no checks beyond the stage index). */
int xmp_sched_append(xmp_schedule_t *s, int group, xmp_action_t a);

typedef enum {
    XMP_SCHED_GPIPE = 0,
    XMP_SCHED_1F1B = 1,
    XMP_SCHED_EAGER_1F1B = 2,
    XMP_SCHED_INTERLEAVED_1F1B = 3,       /* Megatron-LM's interleaved (virtual stage) 1F1B */
    XMP_SCHED_EAGER_INTERLEAVED_1F1B = 4, /* the same, warm-up one deeper per group */
    XMP_SCHED_ZB_V = 5,                   /* ZB-V (Qi et al. 2024): V shape, split I/W */
    XMP_SCHED_V_1F1B = 6,                 /* ZB-V's order with whole backwards (no W delay) */
    XMP_SCHED_DUALPIPE_V = 7,             /* DualPipeV (DeepSeek; PyTorch's order) */
    XMP_SCHED_KIND_COUNT_ = 8
} xmp_sched_kind_t;
/* "gpipe", "1f1b", "eager-1f1b" (also "eager"), "interleaved-1f1b" (also "interleaved"),
 * "eager-interleaved-1f1b", "zb-v" (also "zbv"), "v-1f1b", "dualpipe-v"; -1 if unknown. */
int xmp_sched_kind_parse(const char *name);
const char *xmp_sched_kind_name(int kind);
/* 1 for the kinds that place several stages on a group (interleaved, zb-v, v-1f1b). */
int xmp_sched_kind_virtual(int kind);

/* Options of the generators. Costs (seconds, any unit) only steer where
 * delayed W actions go and, with a memory cap, which candidate is fastest;
 * NULL options: no delay, unit costs, no recomputation, no cap. */
typedef struct {
    int delay_wgrad;   /* B becomes I; W queued and drained when the stage would idle
                        * (zb-v: its own W placement is replaced by this one) */
    double f, i, w;    /* per-microbatch compute costs used to place W (0: 1.0) */
    double xfer;       /* transfer time used to place W */
    int max_pending_w; /* drain W also when more than this many are queued (0: no bound) */
    /* --- recomputation and memory (zero: off) --- */
    int recompute;            /* xmp_recompute_t, stored in the schedule */
    double recompute_frac;    /* selective: fraction of the forward recomputed (0: 0.25) */
    int max_warmup;           /* > 0: at most this many forwards before a group's first backward
                               * (1F1B and interleaved kinds; fewer in flight, more bubble) */
    double max_act_bytes;     /* > 0: memory cap per group (bytes): choose warm-up depth, eager
                               * or not and recomputation (at least `recompute`) so the modelled
                               * peak (xmp_sim_result_t.peak_bytes) is <= the cap, the fastest
                               * such candidate in the simulator with the costs above; refuse
                               * naming the smallest peak reachable otherwise */
    const double *act_bytes;  /* per model stage: bytes one microbatch's activations hold from
                               * F to B (to W when split), without recomputation (cap needs it) */
    const double *ckpt_bytes; /* per model stage: bytes kept under block recomputation (the
                               * chunk's input); NULL: 0 */
    double selective_keep;    /* fraction of act_bytes kept under selective recomputation
                               * (0: 0.5) */
    const double *base_bytes; /* per group: as xmp_sim_costs_t.base_bytes (NULL: 0) */
} xmp_gen_opts_t;

/* Generates a schedule for `kind` over the stage graph.
 *   GPipe: all F (mb order), then all B.
 *   1F1B: stage i runs min(M, S-i) forwards, then alternates B and F, then
 *         the remaining B.
 *   eager-1F1B (AlpaComm section 4): warm-up min(M, 2(S-i)-1) forwards.
 * 1F1B-style kinds refuse M < S. With delay_wgrad, B is replaced by I and the
 * W actions are placed by a simulation with the option costs: a queued W runs
 * when the stage would otherwise wait; all remaining W run before R. Transfers:
 * receives are posted for microbatch 0 at the start and for m+1 right after
 * the wait of m; sends start right after the producing F/I/B; a stage waits
 * just before the F (activations) or B/I (gradients) that needs the data; the
 * sender's own waits come before B/I of that microbatch (activations) or at
 * the end before R (gradients). The result validates and dry-runs. */
int xmp_sched_generate(int kind, int nstages, int nmb, int nedges, const xmp_sedge_t *edges,
                       const xmp_gen_opts_t *opts, xmp_schedule_t **out, char *err, size_t errlen);

/* Generates `kind` over nstages model stages placed on ngroups groups by stage_group
 * (NULL: the kind's own map over ngroups groups: interleaved kinds Megatron's c*R + r,
 * V kinds the V shape, others the identity) and the stage graph `edges`.
 *   interleaved-1f1b (Megatron-LM): each group holds V = nstages/ngroups chunks; forward
 *     k of group r runs chunk (k mod RV) div R on microbatch (k div RV)*R + k mod R,
 *     backward k chunk V-1-((k mod RV) div R); warm-up min(MV, 2(R-r-1) + (V-1)R)
 *     forwards (all MV when M == R), then one forward and one backward alternately,
 *     then the remaining backwards. Needs M a multiple of R (refused naming M, R, V).
 *   eager-interleaved-1f1b: warm-up one forward deeper (sends get a compute slot of slack).
 *   zb-v (ZB-V, Qi et al. 2024, as PyTorch's ScheduleZBVZeroBubble orders it): V = 2,
 *     group r holds stages r and 2R-1-r; chunk-0 forwards 2(R-r)-1, then r pairs (F chunk 1,
 *     F chunk 0), then R-r triples (F, I, W of chunk 1), then the steady F0 I0 W0 F1 I1 W1,
 *     then r pairs (I0, I1), R-r pairs (I0, W0) and the remaining W. With delay_wgrad the
 *     W actions are placed by the simulation instead (for unequal F/I/W costs).
 *   v-1f1b: zb-v's order with each I a whole backward B and no W (no weight-grad delay);
 *     delay_wgrad then splits B and places W by simulation.
 *   dualpipe-v (DualPipeV, as PyTorch's ScheduleDualPipeV orders it): V map, M >= 2R;
 *     chunk-0 forwards 2(R-r-1); r+1 pairs (F0, F1); R-r-1 triples (I1, W1, F1); then
 *     M-2R+r+1 rounds (F0 B1)(F1 B0) (DualPipe's overlapped pairs, run one after the other
 *     here); R-r-1 rounds B1 (F1 B0); r+1 pairs (B1, B0) that switch to I halfway; R-r-1 pairs
 *     (queued W, B0 or I0); the remaining W.
 * Transfers as in xmp_sched_generate, per chunk. The result validates and dry-runs (a map
 * or M the order deadlocks on is refused with the dry run's report). */
int xmp_sched_generate_map(int kind, int nstages, int ngroups, const int *stage_group, int nmb,
                           int nedges, const xmp_sedge_t *edges, const xmp_gen_opts_t *opts,
                           xmp_schedule_t **out, char *err, size_t errlen);

/* The CLI's entry point: schedule `name` (xmp_sched_kind_parse, a "+dw" suffix sets
 * delay_wgrad) for R rank groups with V stages each (the kind's map), M microbatches, a
 * chain 0>1>...>RV-1. One-stage kinds (gpipe, 1f1b, eager-1f1b) need V == 1, zb-v and
 * v-1f1b V == 2; refusals name the bad R, V or M. */
int xmp_sched_generate_named(const char *name, int R, int V, int M, const xmp_gen_opts_t *opts,
                             xmp_schedule_t **out, char *err, size_t errlen);
/* Chain graph 0>1>...>S-1 edges into edges[0..S-2]; returns S-1. */
int xmp_sched_chain_edges(int nstages, xmp_sedge_t *edges);

/* Text form of one action into buf (always NUL-terminated); returns its length. */
int xmp_action_format(xmp_action_t a, char *buf, size_t n);
/* Parses one action token (see grammar); 0 or -1. */
int xmp_action_parse(const char *tok, xmp_action_t *a);
/* Whole schedule as text (grammar above); malloc'ed, caller frees. NULL on OOM. */
char *xmp_sched_format(const xmp_schedule_t *s);
int xmp_sched_fprint(const xmp_schedule_t *s, FILE *f);
int xmp_sched_parse(const char *text, xmp_schedule_t **out, char *err, size_t errlen);

/* Static checks (section "Checks before running"): edges, the stage -> group map (each
 * group's chunks in increasing stage order), per group and chunk every F
 * has exactly one B or one I and one W (W after I, I/B after F), in-flight
 * microbatches within max_inflight, every transfer of every (edge, dir) the
 * stage is an endpoint of started exactly once per microbatch in microbatch
 * order and waited once after its start, F preceded by the waits of its
 * activations, B/I by the waits of its gradients, sends after their
 * producers, at most one R and one O after all compute (O after R). If
 * layer_stage is not NULL: each of the nlayers layers maps to a stage in
 * range and every stage owns at least one layer. Actions name a chunk of their group in
 * range; a transfer's chunk is an endpoint of its edge, and both sides of an edge whose
 * stages share a group are checked separately. */
int xmp_sched_validate(const xmp_schedule_t *s, const int *layer_stage, int nlayers, char *err,
                       size_t errlen);

/* Inputs of the timed simulator. Arrays may be NULL (zero cost). */
typedef struct {
    const double *f, *i, *w; /* per MODEL stage, seconds per microbatch */
    const double *b;         /* per model stage; NULL: i + w */
    const double *xfer;      /* per plan index 2*edge+dir: seconds per transfer */
    double r, o;             /* reduction and optimizer time, every group */
    int late_recv;           /* receivers start each transfer at its wait and wait at once
                              * (driver mode "blocking"): no posting ahead */
    int share_nic;           /* 1: a rank group's NICs carry one transfer at a time in each
                              * direction: a transfer also waits until the previous one out of its
                              * sender's group and the previous one into its receiver's group
                              * ended (in the order transfers can start). Transfers between two
                              * chunks of one group use no NIC. 0: every plan its own link (the
                              * skip edges of a U-Transformer, or the activations and gradients
                              * leaving a middle stage, then overlap for free) */
    double nic_burst_s;      /* with share_nic, > 0: each NIC is a token bucket (a shaped link:
                              * tc tbf, a cloud NIC's burst allowance) holding up to this many
                              * seconds of transfer at its rate. It gains a second of credit per
                              * second idle (full at the start); a transfer of x seconds whose
                              * NICs hold k0 (the smaller of the sender's outgoing and the
                              * receiver's incoming credit) takes max(0, x - k0) and spends x
                              * of each bucket's credit, less what the bucket regains while it
                              * runs. So an isolated transfer (1F1B's boundary round trips, the
                              * NIC idle before) takes x minus the burst while back-to-back
                              * transfers (GPipe's and eager-1F1B's warm-up sends) take x.
                              * 0: every transfer takes x (a link without burst) */
    /* Memory model (NULL / 0: peak_bytes stays 0). A microbatch holds on its stage from the
     * end of F to the end of B (or W): act_bytes without recomputation, act_bytes *
     * selective_keep under selective, ckpt_bytes under block recomputation. A backward
     * (B or I) under recomputation first rebuilds the full act_bytes (a transient on top of
     * what the group holds); after I they stay until W. */
    const double *act_bytes;      /* per model stage */
    const double *ckpt_bytes;     /* per model stage; NULL: 0 */
    double selective_keep;        /* 0: 0.5 */
    const double *base_bytes;     /* per GROUP: bytes the group holds at its peaks besides the
                                   * microbatches' activations (gradient accumulators, backward
                                   * temporaries), added to peak_bytes; NULL: 0 */
    const double *const *act_add; /* per GROUP g, per index i of the schedule's acts[g]: seconds
                                   * added to that F/B/I/W action's cost (a per-action
                                   * correction: the CPU-sharing factor of the search), the sum
                                   * taken as at least 0; the W a filled schedule inserts gets
                                   * none. NULL (or a NULL row): none */
} xmp_sim_costs_t;

typedef struct {
    int ok;              /* 1: every stage finished; 0: deadlock (msg says where) */
    char msg[1024];      /* deadlock report: each stuck stage and its action */
    double step_s;       /* max finish time over stages */
    int nstages;         /* rows: arrays below have one entry per GROUP (== ngroups) */
    double *busy_s;      /* compute time (F/B/I/W/R/O) */
    double *bubble;      /* (step_s - busy_s) / step_s */
    double *recompute_s; /* part of busy_s spent recomputing forwards */
    double *peak_bytes;  /* modelled peak activation bytes (costs' memory model) */
    int *peak_act;       /* max microbatches with F done and B (or W) not done */
    int *len;            /* executed actions per stage (== schedule len if ok) */
    xmp_action_t **acts; /* executed actions (W inserted when filling) */
    double **t0, **t1;   /* per executed action: start and end (waits: blocked span) */
} xmp_sim_result_t;

/* Timed simulation of all stages: one compute stream per stage, transfers per
 * plan FIFO, concurrent with compute. The schedule must validate. res is
 * filled (free with xmp_sim_result_free) even on deadlock; returns 0 when
 * every stage finished, 1 on deadlock, -1 on bad input (err). */
int xmp_sim_run(const xmp_schedule_t *s, const xmp_sim_costs_t *c, xmp_sim_result_t *res, char *err,
                size_t errlen);
void xmp_sim_result_free(xmp_sim_result_t *res);

/* Deadlock dry run: simulates all action lists with blocking waits and
 * per-plan FIFO transfers (timing-independent); late_recv as in
 * xmp_sim_costs_t. 0: completes; 1: deadlock
 * with the stuck actions in err; -1: bad input. */
int xmp_sched_dryrun(const xmp_schedule_t *s, int late_recv, char *err, size_t errlen);

/* Text timeline: one row per stage, `width` columns for step_s; compute
 * actions as their letter + microbatch digits padded with '-', '.' idle.
 * Followed by per-stage bubble and peak activation lines. */
int xmp_sim_render(const xmp_schedule_t *s, const xmp_sim_result_t *res, int width, FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* XMP_SCHEDULE_H */
