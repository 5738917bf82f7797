"""BNS-GCN (Wan et al., MLSys 2022): random boundary-node sampling in the distributed model.

Every step each client keeps all of its inner nodes (no cross-client edge) and keeps each
boundary node (>= 1 cross-client edge) independently with probability p = ``--boundary-p``. The
step then runs exactly like ``ours``: the sample goes through ``GNNMethod.operator_for_sample``, so
a kept boundary node's messages are scaled by 1/p (the estimator of eq. 4 with p(u) = 1 for inner
nodes), dropped boundary nodes neither send nor receive, and the loss is over the kept training
nodes divided by their global count. With p = 1 every node is kept and a step equals a
full-graph step (``ours --sampling none``). Evaluation is the full-graph distributed forward.
"""
from __future__ import annotations

import numpy as np

from mpifgl.config import TrainConfig
from mpifgl.graph import ClientGraph
from mpifgl.methods.gnn import GNNMethod
from mpifgl.sampling import NodeSample
from mpifgl.trainer import RankSetup


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


class BoundarySampler:
    """The ``StepSampler`` of BNS-GCN: every client samples its boundary nodes each step."""

    steps_per_epoch = 1  # an epoch of BNS-GCN is one full-graph pass with sampled boundaries

    def __init__(self, setup: RankSetup):
        graph = setup.graph
        self.capacity = int(graph.client_sizes.max())  # a client can keep all its nodes
        self.client_sampler = (BoundaryNodeSampler(boundary_mask(graph), setup.config.boundary_p,
                                                   setup.sample_rng)
                               if setup.comm.is_client else None)

    def resolved(self, config: TrainConfig) -> TrainConfig:
        return config

    def sample(self) -> NodeSample | None:
        return self.client_sampler.sample() if self.client_sampler is not None else None


def build_bns(setup: RankSetup) -> GNNMethod:
    """``ours`` with the label-guided sampler replaced by boundary-node sampling."""
    return GNNMethod(setup, BoundarySampler(setup))
