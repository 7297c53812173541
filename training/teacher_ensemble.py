"""Several teachers as one: ``--ensemble-teacher NAME[:WEIGHT]``.

Each member's unit-normalised embedding is scaled by the square root of its weight and the
scaled embeddings are concatenated, so for weights summing to 1 the target is a unit vector and

    cos(t(a), t(b)) = sum_k w_k cos(t_k(a), t_k(b))

the weighted mean of the members' cosines. HPD's PCA then reduces the concatenation to ``dim``;
the contrastive methods read the concatenated targets as they read one teacher's.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

import numpy as np

from distilembed.errors import UserError
from training.teacher_targets import Teacher

log = logging.getLogger(__name__)
DEFAULT_MEMBER_WEIGHT = 0.3


def parse_member(spec: str) -> tuple[str, float]:
    """``NAME[:WEIGHT]`` -> (name, weight); the weight defaults to 0.3 and lies in (0, 1)."""
    name, sep, weight = spec.rpartition(":")
    if not sep or not weight.replace(".", "", 1).isdigit():
        name, weight = spec, str(DEFAULT_MEMBER_WEIGHT)
    if not name.strip():
        raise UserError(f"--ensemble-teacher {spec!r}: no teacher name")
    value = float(weight)
    if not 0 < value < 1:
        raise UserError(f"--ensemble-teacher {spec!r}: the weight must lie strictly between 0 and 1")
    return name.strip(), value


def ensemble_weights(specs: Sequence[str]) -> list[tuple[str, float]]:
    """The added members with their weights; what is left of 1 goes to the main teacher."""
    members = [parse_member(spec) for spec in specs]
    if sum(w for _, w in members) >= 1:
        raise UserError("--ensemble-teacher weights must sum to less than 1 (the rest is --teacher's)")
    return members


def combine(parts: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """Concatenate row-normalised ``parts``, each scaled by sqrt(weight), as float16."""
    scaled = []
    for part, weight in zip(parts, weights, strict=True):
        rows = np.asarray(part, dtype=np.float32)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        scaled.append(np.sqrt(weight) * rows / np.maximum(norms, 1e-12))
    return np.concatenate(scaled, axis=1).astype(np.float16)


class EnsembleTeacher:
    """The same ``targets`` / ``path`` / ``fingerprint`` as one ``Teacher``, over several."""

    def __init__(self, members: Sequence[tuple[Teacher, float]]) -> None:
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two teachers")
        self.members = list(members)
        self.name = " + ".join(f"{t.name}:{w:g}" for t, w in self.members)

    @property
    def path(self) -> str:
        return " + ".join(str(t.path) for t, _ in self.members)

    @property
    def fingerprint(self) -> str:
        blob = "|".join(f"{t.fingerprint}:{w!r}" for t, w in self.members)
        return hashlib.sha256(blob.encode()).hexdigest()

    def targets(self, texts: list[str]) -> tuple[np.ndarray, dict[str, object]]:
        """Each member's cached targets, combined (computed per call: members are cached, the
        combination is a concatenation)."""
        results = [teacher.targets(texts) for teacher, _ in self.members]
        combined = combine([r[0] for r in results], [w for _, w in self.members])
        info: dict[str, object] = {"teacher": self.name, "n": len(texts), "dim": combined.shape[1]}
        info["members"] = [r[1] for r in results]
        return combined, info


AnyTeacher = Teacher | EnsembleTeacher


def build_teacher(
    name: str, ensemble: Sequence[str], *, device: str, batch_size: int, backend: str
) -> AnyTeacher:
    """``name`` alone, or ``name`` with the ``--ensemble-teacher`` members."""
    main = Teacher(name, device=device, batch_size=batch_size, backend=backend)
    added = ensemble_weights(ensemble)
    if not added:
        return main
    members = [(Teacher(n, device=device, batch_size=batch_size, backend=backend), w) for n, w in added]
    return EnsembleTeacher([(main, 1 - sum(w for _, w in added)), *members])
