/* Host topology through hwloc (see xm_topo.h for what is classified how). */
#include <ctype.h>
#include <hwloc.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "xm_core.h"
#include "xm_topo.h"

static int is_gpu(const struct hwloc_pcidev_attr_s *p)
{
    return p->vendor_id == 0x10de && (p->class_id == 0x0302 || p->class_id == 0x0300);
}

static int is_nic(const struct hwloc_pcidev_attr_s *p)
{
    return (p->class_id >> 8) == 0x02;
}

static void busid_of(const struct hwloc_pcidev_attr_s *p, char *buf, size_t len)
{
    snprintf(buf, len, "%04x:%02x:%02x.%01x", (unsigned)p->domain, p->bus, p->dev, p->func);
}

/* Edges between a and b in the object tree (I/O objects hang below the
 * normal object they are local to, so two devices behind one PCIe switch
 * are 2 hops apart, behind one host bridge 4, across packages more). */
static int tree_distance(hwloc_obj_t a, hwloc_obj_t b)
{
    int da = 0, db = 0;
    for (hwloc_obj_t x = a; x->parent; x = x->parent)
        da++;
    for (hwloc_obj_t x = b; x->parent; x = x->parent)
        db++;
    int hops = 0;
    while (da > db) {
        a = a->parent, da--, hops++;
    }
    while (db > da) {
        b = b->parent, db--, hops++;
    }
    while (a != b) {
        a = a->parent, b = b->parent, hops += 2;
    }
    return hops;
}

/* CPU side of an I/O object: cpuset list and first NUMA node. */
static void locality(hwloc_topology_t topo, hwloc_obj_t o, char *cpuset, size_t len, int *numa)
{
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
    *numa = -1;
    cpuset[0] = 0;
    if (!anc)
        return;
    if (anc->cpuset)
        hwloc_bitmap_list_snprintf(cpuset, len, anc->cpuset);
    if (anc->nodeset)
        *numa = hwloc_bitmap_first(anc->nodeset);
}

static int cmp_gpu(const void *a, const void *b)
{
    return strcmp(((const xm_topo_gpu_t *)a)->busid, ((const xm_topo_gpu_t *)b)->busid);
}

static int cmp_nic(const void *a, const void *b)
{
    return strcmp(((const xm_topo_nic_t *)a)->busid, ((const xm_topo_nic_t *)b)->busid);
}

static hwloc_obj_t find_pci(hwloc_topology_t topo, const char *busid)
{
    char b[16];
    for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, NULL); o; o = hwloc_get_next_pcidev(topo, o)) {
        busid_of(&o->attr->pcidev, b, sizeof b);
        if (!strcmp(b, busid))
            return o;
    }
    return NULL;
}

/* Fills GPUs and NICs from the PCI devices, names from their OS devices. */
static xmesh_result_t collect(hwloc_topology_t topo, xm_topo_t *t)
{
    int ng = 0, nn = 0;
    for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, NULL); o; o = hwloc_get_next_pcidev(topo, o)) {
        ng += is_gpu(&o->attr->pcidev);
        nn += is_nic(&o->attr->pcidev);
    }
    t->gpus = calloc(ng ? ng : 1, sizeof *t->gpus);
    t->nics = calloc(nn ? nn : 1, sizeof *t->nics);
    t->gpu_nic_dist = calloc(ng > 0 && nn > 0 ? (size_t)ng * nn : 1, sizeof(int));
    if (!t->gpus || !t->nics || !t->gpu_nic_dist)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "topology: out of memory for %d GPUs, %d NICs", ng, nn);
    for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, NULL); o; o = hwloc_get_next_pcidev(topo, o)) {
        const struct hwloc_pcidev_attr_s *p = &o->attr->pcidev;
        if (is_gpu(p)) {
            xm_topo_gpu_t *g = &t->gpus[t->ngpus++];
            busid_of(p, g->busid, sizeof g->busid);
            g->vendor = p->vendor_id;
            g->device = p->device_id;
            g->cuda_index = -1;
            locality(topo, o, g->cpuset, sizeof g->cpuset, &g->numa);
            for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling)
                if (c->type == HWLOC_OBJ_OS_DEVICE && !strncmp(c->name, "cuda", 4) &&
                    isdigit((unsigned char)c->name[4])) {
                    snprintf(g->name, sizeof g->name, "%s", c->name);
                    g->cuda_index = atoi(c->name + 4);
                }
        } else if (is_nic(p)) {
            xm_topo_nic_t *n = &t->nics[t->nnics++];
            busid_of(p, n->busid, sizeof n->busid);
            n->class_id = p->class_id;
            n->vendor = p->vendor_id;
            n->device = p->device_id;
            locality(topo, o, n->cpuset, sizeof n->cpuset, &n->numa);
            for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
                if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name)
                    continue;
                if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS)
                    snprintf(n->name, sizeof n->name, "%s", c->name);
                else if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK)
                    snprintf(n->netdev, sizeof n->netdev, "%s", c->name);
            }
            if (!n->name[0])
                snprintf(n->name, sizeof n->name, "%s", n->netdev[0] ? n->netdev : n->busid);
        }
    }
    qsort(t->gpus, t->ngpus, sizeof *t->gpus, cmp_gpu);
    qsort(t->nics, t->nnics, sizeof *t->nics, cmp_nic);

    /* Distances after sorting, so that rows and columns follow the indices. */
    for (int g = 0; g < t->ngpus; g++) {
        hwloc_obj_t og = find_pci(topo, t->gpus[g].busid);
        t->gpus[g].nic = -1;
        for (int n = 0; n < t->nnics; n++) {
            int d = tree_distance(og, find_pci(topo, t->nics[n].busid));
            t->gpu_nic_dist[g * t->nnics + n] = d;
            if (t->gpus[g].nic < 0 || d < t->gpus[g].nic_distance) {
                t->gpus[g].nic = n;
                t->gpus[g].nic_distance = d;
            }
        }
    }
    for (int n = 0; n < t->nnics; n++) {
        t->nics[n].gpu = -1;
        int best = 0;
        for (int g = 0; g < t->ngpus; g++) {
            int d = t->gpu_nic_dist[g * t->nnics + n];
            if (t->nics[n].gpu < 0 || d < best) {
                t->nics[n].gpu = g;
                best = d;
            }
            t->nics[n].ngpus_closest += t->gpus[g].nic == n;
        }
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xm_topo_load(const char *xml_path, xm_topo_t **out)
{
    xmesh_result_t r;
    int xml = xml_path && *xml_path;
    if (!out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_topo_load: out is NULL");
    xm_topo_t *t = calloc(1, sizeof *t);
    if (!t)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "topology: out of memory");
    snprintf(t->source, sizeof t->source, "%s", xml ? xml_path : "this machine");
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) < 0) {
        r = XM_ERR(XMESH_ERR_SYSTEM, "hwloc_topology_init failed");
        goto out_free_t;
    }
    /* Keep GPUs, NICs and the bridges between them; drop other PCI noise. */
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (xml && hwloc_topology_set_xml(topo, xml_path) < 0) {
        r = XM_ERR(XMESH_ERR_SYSTEM, "hwloc cannot read topology XML '%s'", xml_path);
        goto out_destroy_topo;
    }
    if (hwloc_topology_load(topo) < 0) {
        r = XM_ERR(XMESH_ERR_SYSTEM, "hwloc_topology_load failed for %s", t->source);
        goto out_destroy_topo;
    }
    hwloc_obj_t root = hwloc_get_root_obj(topo);
    const char *hn = hwloc_obj_get_info_by_name(root, "HostName");
    if (hn)
        snprintf(t->hostname, sizeof t->hostname, "%s", hn);
    else if (gethostname(t->hostname, sizeof t->hostname - 1) != 0)
        snprintf(t->hostname, sizeof t->hostname, "unknown");
    t->host_id = xm_hash64(XM_HASH_INIT, t->hostname, strlen(t->hostname));
    t->npus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    t->nnuma = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    if ((r = collect(topo, t)))
        goto out_destroy_topo;
    hwloc_topology_destroy(topo);
    *out = t;
    return XMESH_SUCCESS;
out_destroy_topo:
    hwloc_topology_destroy(topo);
out_free_t:
    xm_topo_free(t);
    return r;
}

void xm_topo_free(xm_topo_t *t)
{
    if (!t)
        return;
    free(t->gpus);
    free(t->nics);
    free(t->gpu_nic_dist);
    free(t);
}

int xm_topo_nics_per_host(const xm_topo_t *t)
{
    return t && t->nnics > 0 ? t->nnics : 1;
}

int xm_topo_nic_for_gpu(const xm_topo_t *t, int g)
{
    return t && g >= 0 && g < t->ngpus ? t->gpus[g].nic : -1;
}

int xm_topo_gpu_for_nic(const xm_topo_t *t, int n)
{
    return t && n >= 0 && n < t->nnics ? t->nics[n].gpu : -1;
}

/* Compares bus ids ignoring case and the width of the domain field
 * ("00000000:41:00.0" from CUDA, "0000:41:00.0" from hwloc, "41:00.0"). */
static const char *busid_tail(const char *s)
{
    const char *c1 = strchr(s, ':');
    if (c1 && strchr(c1 + 1, ':'))
        return c1 + 1;
    return s;
}

int xm_topo_gpu_by_busid(const xm_topo_t *t, const char *busid)
{
    if (!t || !busid)
        return -1;
    for (int g = 0; g < t->ngpus; g++)
        if (!strcasecmp(busid_tail(t->gpus[g].busid), busid_tail(busid)))
            return g;
    return -1;
}

int xm_topo_pick_sender(const xm_topo_t *t, const int *cand, int n, int nic)
{
    if (!t || !cand || n <= 0 || nic < 0 || nic >= t->nnics)
        return -1;
    int best = -1, bestd = 0;
    for (int i = 0; i < n; i++) {
        if (cand[i] < 0 || cand[i] >= t->ngpus)
            return -1;
        int d = t->gpu_nic_dist[cand[i] * t->nnics + nic];
        if (best < 0 || d < bestd)
            best = cand[i], bestd = d;
    }
    return best;
}

void xm_topo_print(const xm_topo_t *t, FILE *f)
{
    fprintf(f, "host %s (id %016llx, from %s): %d PUs, %d NUMA nodes, %d GPUs, %d NICs\n",
            t->hostname, (unsigned long long)t->host_id, t->source, t->npus, t->nnuma, t->ngpus,
            t->nnics);
    for (int g = 0; g < t->ngpus; g++) {
        const xm_topo_gpu_t *x = &t->gpus[g];
        fprintf(f, "  gpu %d  %s  [%04x:%04x] %-6s numa %d cpus %-8s closest nic %d (%d hops)\n", g,
                x->busid, x->vendor, x->device, x->name[0] ? x->name : "-", x->numa, x->cpuset,
                x->nic, x->nic < 0 ? 0 : x->nic_distance);
    }
    for (int n = 0; n < t->nnics; n++) {
        const xm_topo_nic_t *x = &t->nics[n];
        fprintf(f,
                "  nic %d  %s  [%04x:%04x] class %04x %-8s netdev %-6s numa %d cpus %-8s "
                "closest gpu %d, closest to %d gpu(s)\n",
                n, x->busid, x->vendor, x->device, x->class_id, x->name,
                x->netdev[0] ? x->netdev : "-", x->numa, x->cpuset, x->gpu, x->ngpus_closest);
    }
}
