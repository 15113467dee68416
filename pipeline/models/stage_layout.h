/* Stage layout: which layers of a model run on which pipeline stage, and on
 * which mesh with which strategy (Megatron-style --layout strings).
 *
 * A model names its layers with one-letter kinds in model order (GPT-2:
 * 'E' embedding, 't' transformer block, 'L' final norm + head + loss; the
 * U-Transformer: 'u' for each of its 13 layers). A layout string lists the
 * kinds per stage, stages separated by '|', items by ',', "k*n" repeating a
 * kind: "E,t*3|t*3,L" is 2 stages of 4 items each. Without a layout string,
 * `stages` stages get the model's layers split evenly (the first stage takes
 * the remainder first, like numpy.array_split); the fixed first/last items
 * (GPT-2's E and L) stay on the first/last stage.
 *
 * Meshes: stage s runs on an N-D mesh of ndim[s] (1..4) axes, shape[s][0..ndim)
 * (row-major devices), ranks rank0[s] .. rank0[s] + size - 1, stages in
 * order. "--stage-mesh 2x2x2,1x4" gives the shapes directly (any axis count per
 * stage; "4" is a 1-axis mesh). The shorthands (--stage-dp / --stage-tp, and
 * the 2-axis "RxC" forms) make 2-axis dp x tp meshes (axis 0 data parallel,
 * axis 1 tensor parallel). dp[s] and tp[s] keep that meaning for 2-axis meshes;
 * for other axis counts tp[s] is the last axis' size and dp[s] the product of
 * the others (1-axis: dp = the size, tp = 1). Pure code, no MPI: every rank
 * computes the same plan from the same flags.
 */
#ifndef XMP_STAGE_LAYOUT_H
#define XMP_STAGE_LAYOUT_H

#include <stddef.h>

#define XMP_MAX_STAGES 32
#define XMP_MAX_LAYERS 512
#define XMP_STAGE_MAX_AXES 4

typedef struct {
    int nstages;
    int nitems;                                    /* layers of the model, in model order */
    char kind[XMP_MAX_LAYERS];                     /* kind letter of each layer */
    int stage_of[XMP_MAX_LAYERS];                  /* stage of each layer */
    int first[XMP_MAX_STAGES];                     /* first layer index of each stage */
    int count[XMP_MAX_STAGES];                     /* layers of each stage */
    int dp[XMP_MAX_STAGES];                        /* data-parallel degree (mesh axis 0) */
    int tp[XMP_MAX_STAGES];                        /* tensor-parallel degree (mesh axis 1) */
    int ndim[XMP_MAX_STAGES];                      /* mesh axes of each stage (1..4) */
    int shape[XMP_MAX_STAGES][XMP_STAGE_MAX_AXES]; /* mesh shape of each stage */
    int rank0[XMP_MAX_STAGES];                     /* first global rank of each stage */
    int nranks;                                    /* ranks used by all stages */
    /* Virtual stages (issue 23): rank group of each stage; stages of one group run on the same
     * ranks (rank0 of the group, the same number of ranks; the mesh shapes may differ).
     * xmp_stage_layout_build sets the identity (ngroups == nstages). */
    int ngroups;
    int group[XMP_MAX_STAGES];
} xmp_stage_layout_t;

/* Builds a layout.
 *   kinds      the model's layers in order, e.g. "Ettttttl" for GPT-2 (a
 *              NUL-terminated string of kind letters);
 *   fixed_head number of leading layers that must stay on stage 0 (GPT-2: 1)
 *   fixed_tail number of trailing layers that must stay on the last stage
 *   layout     a layout string or NULL (then `stages` even stages)
 *   stages     number of stages when layout is NULL (>= 1)
 *   meshes     "AxBxC,RxC,N,..." one per stage (1..4 axes each) or NULL
 *              (then dp x tp)
 *   dps, tps   "N,N,..." per stage or NULL (then 1), or a single "N" for all;
 *              with meshes, each mesh must be the 2-axis dp x tp ("R" is R x 1)
 * Returns 0, or -1 with a message naming the bad value in err; *out is then
 * unchanged. */
int xmp_stage_layout_build(const char *kinds, int fixed_head, int fixed_tail, const char *layout,
                           int stages, const char *meshes, const char *dps, const char *tps,
                           xmp_stage_layout_t *out, char *err, size_t errlen);

/* Stage of a global rank, or -1 if the rank is in no stage (with virtual stages: the lowest
 * stage of its group). */
int xmp_stage_layout_stage_of_rank(const xmp_stage_layout_t *l, int rank);

/* Places the stages on ngroups rank groups: stage s runs on group stage_group[s] (every group
 * 0..ngroups-1 used; sched/schedule.h xmp_sched_interleaved_map / xmp_sched_vshape_map /
 * xmp_sched_parse_map make such maps). The stages of one group must have meshes of the same
 * size; groups get consecutive ranks in group order (rank0[s] = the group's first rank) and
 * nranks becomes the sum of the group sizes. 0, or -1 with a message naming the bad stage or
 * group (l untouched). */
int xmp_stage_layout_set_groups(xmp_stage_layout_t *l, int ngroups, const int *stage_group,
                                char *err, size_t errlen);

/* xmp_stage_layout_build with virtual stages (a CLI's --virtual-stages / --stage-groups):
 * R rank groups; S model stages: the layout string's count, else R * V (V >= 1; with a layout
 * and V > 1, S must equal R * V); stages placed on groups by map_text (sched/schedule.h
 * xmp_sched_parse_map: "interleaved", "v" or a list of S group ids). meshes lists one mesh per
 * group (R entries, each stage gets its group's) or one per stage (S entries); dps / tps as in
 * xmp_stage_layout_build (per stage or one value). Then xmp_stage_layout_set_groups. 0, or -1
 * with a message naming the bad value (*out unchanged). */
int xmp_stage_layout_build_groups(const char *kinds, int fixed_head, int fixed_tail,
                                  const char *layout, int R, int V, const char *map_text,
                                  const char *meshes, const char *dps, const char *tps,
                                  xmp_stage_layout_t *out, char *err, size_t errlen);

/* Stages of a global rank's group in increasing order into out[0..max); returns how many
 * (0: the rank is in no stage). */
int xmp_stage_layout_stages_of_rank(const xmp_stage_layout_t *l, int rank, int *out, int max);

/* Writes the layout back as a layout string ("E,t*3|t*3,L"). */
void xmp_stage_layout_format(const xmp_stage_layout_t *l, char *buf, size_t len);

/* Writes the stage meshes as a --stage-mesh string ("2x2x2,1x4"). */
void xmp_stage_layout_format_meshes(const xmp_stage_layout_t *l, char *buf, size_t len);

/* Ranks of stage s (the product of its mesh shape). */
int xmp_stage_layout_size(const xmp_stage_layout_t *l, int s);

#endif /* XMP_STAGE_LAYOUT_H */
