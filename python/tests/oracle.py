"""The test oracle: which piece of the global array each rank holds,
computed here from the layout's structure with numpy.array_split semantics
(the first n mod k shards get one more element), independently of the
library's own offsets."""

import numpy as np


class Spec:
    """A layout described by structure: mesh shape and ranks, for each tensor
    dim the mesh axes splitting it (major to minor), and the partial-sum axes."""

    def __init__(self, shape, mesh_shape, ranks, dim_axes, partial_axes=()):
        self.shape = tuple(shape)
        self.mesh_shape = tuple(mesh_shape)
        self.ranks = list(ranks)
        self.dim_axes = [list(a) for a in dim_axes]
        self.partial_axes = list(partial_axes)

    def sbp_ok(self):
        # SBP lists a dim's axes in ascending order only (the lower axis is major).
        return all(a == sorted(a) for a in self.dim_axes)

    def gspmd(self, commas=False):
        assert not self.partial_axes
        toks = ["R" if not a else "S" + "".join(map(str, a)) for a in self.dim_axes]
        return ",".join(toks) if commas else "".join(toks)

    def sbp(self):
        toks = []
        for ax in range(len(self.mesh_shape)):
            d = [i for i, a in enumerate(self.dim_axes) if ax in a]
            toks.append(f"S({d[0]})" if d else ("P" if ax in self.partial_axes else "B"))
        return ",".join(toks)

    def coord(self, rank):
        if rank not in self.ranks:
            return None
        return np.unravel_index(self.ranks.index(rank), self.mesh_shape)

    def slices(self, rank):
        c = self.coord(rank)
        if c is None:
            return None
        out = []
        for n, axes in zip(self.shape, self.dim_axes):
            k, idx = 1, 0
            for a in axes:
                k *= self.mesh_shape[a]
                idx = idx * self.mesh_shape[a] + int(c[a])
            q, r = divmod(n, k)
            start = idx * q + min(idx, r)
            out.append(slice(start, start + q + (1 if idx < r else 0)))
        return tuple(out)

    def npartials(self):
        return int(np.prod([self.mesh_shape[a] for a in self.partial_axes])) if self.partial_axes else 1

    def partial_index(self, rank):
        c = self.coord(rank)
        idx = 0
        for a in self.partial_axes:
            idx = idx * self.mesh_shape[a] + int(c[a])
        return idx


def random_mesh(rng, nranks, max_axes=3):
    """(mesh_shape, ranks): a random subset of ranks in random order, 1..max_axes axes."""
    m = int(rng.integers(1, nranks + 1))
    ranks = [int(r) for r in rng.permutation(nranks)[:m]]
    shape, left = [], m
    naxes = int(rng.integers(1, max_axes + 1))
    for _ in range(naxes - 1):
        divs = [d for d in range(1, left + 1) if left % d == 0]
        d = int(rng.choice(divs))
        shape.append(d)
        left //= d
    shape.append(left)
    return tuple(shape), ranks


def random_spec(rng, shape, mesh_shape, ranks, partial=False, sbp=False):
    """Random assignment of mesh axes to tensor dims (each axis at most once)."""
    ndim, naxes = len(shape), len(mesh_shape)
    dim_axes = [[] for _ in range(ndim)]
    partial_axes = []
    for ax in rng.permutation(naxes):
        ax = int(ax)
        u = rng.random()
        if partial and u < 0.35:
            partial_axes.append(ax)
        elif ndim and u < 0.75:
            dim_axes[int(rng.integers(ndim))].append(ax)
    if sbp:
        dim_axes = [sorted(a) for a in dim_axes]
    return Spec(shape, mesh_shape, ranks, dim_axes, sorted(partial_axes))


def values(rng, dtype, shape, small=False):
    """Random values exactly representable in dtype (sums of a few stay exact)."""
    dt = np.dtype(dtype)
    if dt.kind == "u":
        v = rng.integers(0, 4 if small else 256, size=shape)
    elif small:
        v = rng.integers(-3, 4, size=shape)
    elif dt.itemsize == 1:
        v = rng.integers(-128, 128, size=shape)
    else:
        v = rng.integers(-100, 101, size=shape)
    return v.astype(dt)
