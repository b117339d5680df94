"""The deformer interface: the protocol every deformer implements and the requests it receives.

The generator decides *what* to change (which anatomical sub-regions, grow or shrink, which point
prompts; see ``deformation_plan``); a deformer decides *how* the mask changes. Every deformer receives
the same requests, so the plan, the prompts and every answer derived from them are the same code path;
only the mask shapes differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..morph import MaskGeometry
from ..points import Point


@dataclass
class Prompt:
    """One anatomy's instruction: grow (``expansion``) or shrink (``contraction``) the mask at points."""

    anatomy: str
    operation: str
    points: list[Point]
    #: distance of the deepest points from the mask edge (px)
    reach: float
    #: where the change is meant to happen (the anatomical sub-region, or the lungs for distractors)
    region: np.ndarray = field(repr=False)

    @property
    def positive(self) -> bool:
        return self.operation == "expansion"

    @property
    def center(self) -> Point:
        """Rounded mean of the points: the step's gold point for the opposite revision."""
        return center_of(self.points)


def center_of(points: list[Point]) -> Point:
    arr = np.asarray(points, dtype=np.float64)
    cx, cy = np.floor(arr.mean(axis=0) + 0.5)
    return int(cx), int(cy)


@dataclass
class DeformRequest:
    """Deform ``base`` following ``prompts``; ``fake`` marks distractor masks (spec 5.4.8)."""

    base: MaskGeometry
    prompts: list[Prompt]
    lungs: np.ndarray = field(repr=False)
    fake: bool = False


class Deformer(Protocol):
    """Turns a mask plus point prompts into a deformed mask of the same shape."""

    name: str

    def begin_case(self, image: np.ndarray) -> None:
        """Called once per case with the CXR (H x W x 3 uint8) the prompts refer to."""

    def deform(self, request: DeformRequest, rng: np.random.Generator) -> np.ndarray:
        """The deformed mask (bool, same shape as the base mask)."""
        ...


def satisfies(mask: np.ndarray, prompts: list[Prompt]) -> bool:
    """Every expansion point inside the mask, every contraction point outside, mask not empty."""
    if not mask.any():
        return False
    for prompt in prompts:
        for x, y in prompt.points:
            if bool(mask[y, x]) != prompt.positive:
                return False
    return True
