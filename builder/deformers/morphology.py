"""The ``morphology`` deformer: deterministic, CPU-only, distance-transform based.

For each expansion prompt the mask grows by a band as deep as the prompt's deepest point (plus 2 px),
limited to pixels within ``reach + 15`` px of one of its points (or of their centre, the gold point)
and to the prompt's region; for each contraction prompt the mask loses the same kind of band on its
inside, deep enough to take the centre too. Growth happens only outside
the base mask and shrinkage only inside it, both only inside the chosen sub-regions, so every
expansion point ends inside the result and every contraction point outside it.
"""

from __future__ import annotations

import numpy as np

from ..morph import disks
from .base import DeformRequest

#: extra depth beyond the deepest prompt point, so the points sit strictly inside the change
BAND_MARGIN = 2
#: extra radius around each point within which the band is applied
NEAR_MARGIN = 15


class MorphologyDeformer:
    name = "morphology"

    def begin_case(self, image: np.ndarray) -> None:  # the image plays no part
        return None

    def deform(self, request: DeformRequest, rng: np.random.Generator) -> np.ndarray:
        base = request.base
        shape = base.shape
        grow = np.zeros(shape, dtype=bool)
        shrink = np.zeros(shape, dtype=bool)
        for prompt in request.prompts:
            cx, cy = prompt.center
            near = disks([*prompt.points, prompt.center], prompt.reach + NEAR_MARGIN, shape)
            band = np.zeros(shape, dtype=bool)
            if prompt.positive:
                depth = prompt.reach + BAND_MARGIN
                win, dist = base.distance_outside(int(np.ceil(depth)))
                band[win] = (dist <= depth) & ~base.mask[win]
                grow |= band & near & prompt.region
            else:
                win, dist = base.distance_inside()
                depth = prompt.reach + BAND_MARGIN
                y, x = cy - win[0].start, cx - win[1].start
                if 0 <= y < dist.shape[0] and 0 <= x < dist.shape[1]:
                    depth = max(depth, float(dist[y, x]) + BAND_MARGIN)
                band[win] = base.mask[win] & (dist <= depth)
                shrink |= band & near & prompt.region
        return (base.mask | grow) & ~shrink
