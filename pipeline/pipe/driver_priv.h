/* Private to pipeline/pipe: the driver's state, shared between driver.c (transfers, step,
 * predictions, trace) and driver_create.c (configuration check, plans, create, destroy).
 * Never installed. */
#ifndef XMP_PIPE_DRIVER_PRIV_H
#define XMP_PIPE_DRIVER_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "pipe/driver.h"

enum { TR_COMPUTE = 0, TR_XFER = 1, TR_WAIT = 2 };

typedef struct {
    int track, kind, mb, edge, dir, chunk;
    double t0, t1;
    int64_t flow; /* 0: none; >0: 's' at t0 (transfer) or 'f' at t1 (wait) */
} ev_t;

typedef struct {
    xmesh_plan_t plan;
    int role;              /* 0 sender, 1 receiver, 2 both (the two stages share this rank's group),
                            * -1 this rank is not in either mesh */
    size_t sbytes, rbytes; /* this rank's block bytes as sender / receiver */
    void **sbuf, **rbuf;   /* per mb: send source / receive destination (NULL: not that side) */
    xmesh_request_t req;   /* in flight, or NULL */
    int req_mb;
    double req_t0;
    int *queue, qhead, qtail;
    char *done;
    unsigned char sig[2];      /* signal mode: 1-byte send and receive blocks */
    xmesh_dtype_t dtype, wire; /* the edge's dtype and the dtype on the wire */
    int64_t relems;            /* receiver: elements of this rank's block */
    void **wbuf;               /* per mb (receiver, wire != dtype): the received wire block,
                                * widened into rbuf at the wait; NULL otherwise */
    /* Bundles: the edges that cross the same stage boundary in the same direction and in the
     * same slots of the schedule (started after the same compute action, waited before the
     * same one) move as one plan of many, held by the bundle's lead (its lowest plan index).
     * lead: the lead's index (itself for a lead); nmem, mem: a lead's members in plan order
     * (itself first). plan, req, queue, queued and done are used on leads only. */
    int lead, nmem, *mem;
    char *queued; /* per mb: queued or issued this step */
} plan_t;

struct xmp_driver {
    xmp_driver_cfg_t cfg;
    xmp_edge_cfg_t *edges;
    char **specs; /* 4 per edge, owned */
    xmp_stage_mesh_t *meshes;
    int **mesh_ranks;
    xmesh_mesh_t *mesh;
    int rank, size, stage, M, P;
    int group, nch;          /* this rank's group (-1: none) and its number of stages */
    const int *ch_stage;     /* [nch]: model stage of each chunk (the schedule's map) */
    xmp_stage_ops_t *ch_ops; /* [nch] */
    int *nin, *nout;         /* [nch] */
    int **in_e, **out_e;     /* [nch][E] */
    plan_t *plans;
    int nplans;          /* xmesh plans created (one per bundle) */
    void **argbuf;       /* scratch pointer arrays for the callbacks */
    void **bsrc, **bdst; /* scratch block arrays of a bundle's plan of many */
    double t_origin;
    int64_t step_no;
    ev_t *ev;
    size_t nev, capev;
    char err[1024];
    /* per-step counters */
    double compute_s, wait_s, loss_acc;
    int held, peak_held;
    int64_t peak_bytes;
};

#endif
