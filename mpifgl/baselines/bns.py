"""BNS-GCN (Wan et al., MLSys 2022): random boundary-node sampling in the distributed model.

Every step each client keeps all of its inner nodes (no cross-client edge) and keeps each
boundary node (>= 1 cross-client edge) independently with probability p = ``--boundary-p``. The
step then runs exactly like ``ours``: the sample goes through ``Trainer.operator_for_sample``, so
a kept boundary node's messages are scaled by 1/p (the estimator of eq. 4 with p(u) = 1 for inner
nodes), dropped boundary nodes neither send nor receive, and the loss is over the kept training
nodes divided by their global count. With p = 1 every node is kept and a step equals a
full-graph step (``ours --sampling none``). Evaluation is the full-graph distributed forward.
"""
from __future__ import annotations

import numpy as np

from mpifgl.graph import ClientGraph, LayerOperator
from mpifgl.sampling import NodeSample
from mpifgl.trainer import Trainer


def boundary_mask(graph: ClientGraph) -> np.ndarray:
    """bool [n_i]: the node has at least one cross-client edge."""
    return np.diff(graph.cross.indptr) > 0


class BoundaryNodeSampler:
    """One client's BNS sample: inner nodes always, boundary nodes i.i.d. with probability p."""

    def __init__(self, boundary: np.ndarray, p: float, rng: np.random.Generator):
        if not 0.0 < p <= 1.0:
            raise ValueError(f"boundary keep probability {p!r}, expected a value in (0, 1]")
        self.boundary = np.asarray(boundary, dtype=bool)
        self.p = float(p)
        self.rng = rng

    def sample(self) -> NodeSample:
        keep = ~self.boundary | (self.rng.random(self.boundary.shape[0]) < self.p)
        index = np.flatnonzero(keep).astype(np.int64)
        probability = np.where(self.boundary[index], self.p, 1.0)
        return NodeSample(index, probability)


class BNSTrainer(Trainer):
    """``ours`` with the label-guided sampler replaced by boundary-node sampling."""

    uses_node_sampler = False

    def _setup_counts_and_sampler(self) -> None:
        super()._setup_counts_and_sampler()  # global counts; the boundary sampler is set here
        if self.graph.client_id >= 0:
            self.sampler = BoundaryNodeSampler(boundary_mask(self.graph), self.config.boundary_p,
                                               self.sample_rng)

    def sample_operator(self) -> tuple[LayerOperator, int]:
        """Phase 'sample': a fresh boundary sample every step (the server contributes none)."""
        return self.operator_for_sample(self.sampler.sample() if self.sampler is not None else None)
