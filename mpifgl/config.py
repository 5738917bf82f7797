"""Training configuration: one frozen dataclass, one CLI flag per field, one spelling each.

Defaults are the paper's settings (appendix D: hidden 128, dropout 0.2, 2 layers, 200 epochs,
Adam) and label-guided sampling of a quarter of the nodes (the paper's 5,000 of PubMed's 19,717);
above 20,000 nodes one step of n draws per epoch with the first layer exact, or with
GraphSAGE layers the paper's fifth of the nodes per step (mpifgl.sampling).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fgl_common.cli import (CommaSeparated, add_dataclass_arguments, check_finite,
                             dataclass_from_namespace, option)
from mpifgl.registry import (BACKBONES, CLIENT_WEIGHTS, EXCHANGES, METHODS, OPTIMIZERS,
                             SAMPLINGS, graphsage_fanouts, maskable)
from mpifgl.watchdog import (ANSWER_SECONDS, EPOCHS_OF_TIMEOUT, FLOOR_SECONDS,
                             SETUP_SECONDS)

HIDE_RULES = ("not-train-test", "val")  # --neighgen-hide-from (mpifgl.methods.neighgen)

DTYPES = ("float32", "float64")
# --secure masks the compact exchange of the distributed GNN (docs/privacy.md says why no other)
SECURE_ALGOS = maskable(METHODS)
SECURE_EXCHANGES = maskable(EXCHANGES)
EXACT_FIRST_ALGOS = tuple(name for name, method in METHODS.items() if method.whole_graph_gnn)
CAGNET_ALGO = "cagnet"  # the method --replication belongs to
AVERAGING_ALGOS = tuple(name for name, method in METHODS.items() if method.averages_models)
ROUND_ALGOS = tuple(name for name, method in METHODS.items() if method.neighbour_round)
HOPS = (0, 1, 2)
# --round-norm: FedGraph's norm_type; the weights are mpifgl.methods.fedgcn.round_weights
ROUND_NORMS = ("none", "row", "sym")
WIRE_DTYPES = ("same", "bfloat16", "float16")
NARROW_WIRE_EXCHANGES = tuple(name for name, entry in EXCHANGES.items() if entry.narrow_wire)


@dataclass(frozen=True)
class TrainConfig:
    # Data and outputs
    shards: str = option("", "shard directory written by `python -m data_prep`; empty: the default "
                             "dataset's shards under shards/, prepared first if missing")
    out: str = option("", "run directory to create; empty: runs/<dataset>-<algo>-<date>-<time>."
                          "<microseconds>-<j + SLURM job id, or p + pid> (e.g. runs/cora-ours-"
                          "20261127-093015.123456-p4242); with --resume: continue into this "
                          "new directory instead of the resumed one")
    dataset: str = option("cora", "dataset prepared when --shards is empty (default run only)")
    data_root: str = option("", "raw data root for that preparation; empty: data_prep's default "
                                "(../shared/data beside the checkout, else the download cache)")
    force: bool = option(False, "allow --out to name an existing non-empty run directory")
    # Method
    algo: str = option("ours", "ours = distributed model over MPI; centralized = same model code "
                               "on the whole graph in one process (the reference); baselines: "
                               "graphsage, graphsaint (centralized), fedavg, fedavg-nc, bns, "
                               "cagnet, fedgcn, fedsage-plus, llcg (over MPI); see docs/algorithms.md",
                               tuple(METHODS))
    backbone: str = option("gcn", "; ".join(f"{e.name} = {e.summary}" for e in BACKBONES.values())
                           + ". gcn is the paper's; with sage the paper's sampler kept its margin "
                             "over centralized on a products-like proxy where gcn's collapsed "
                             "(docs/paper_scale.md, section 9)", tuple(BACKBONES))
    layers: int = option(2, "number of graph layers (paper: 2 on PubMed)")
    hidden: int = option(128, "hidden width (paper: 128)")
    dropout: float = option(0.2, "dropout on every layer's input (paper: 0.2)")
    lr: float = option(0.01, "learning rate of --optimizer (paper: Adam, searching 0.1, 0.01, "
                             "0.001)")
    weight_decay: float = option(0.0, "weight decay (L2, added to the gradient)")
    optimizer: str = option("adam", "; ".join(f"{e.name} = {e.summary}"
                                              for e in OPTIMIZERS.values()), tuple(OPTIMIZERS))
    epochs: int = option(200, "training epochs (paper: 200 on PubMed and Reddit)")
    # Sampling (paper section 2.2)
    sampling: str = option("label", "label = label-guided (ours); uniform = same estimator with "
                                    "uniform Q; none = full graph every step (ours-full; the "
                                    "default of --algo centralized)", tuple(SAMPLINGS))
    sample_size: int = option(0, "draws s per step over all clients, split s_i = n_i s / n; "
                                 "0: by the graph's size, a quarter of the nodes rounded up (4 "
                                 "steps make a pass, the paper's setting) up to 20,000 nodes; "
                                 "above, all n in one step per epoch with --exact-first-layer "
                                 "(gcn, 1gnn: it keeps centralized's accuracy where the "
                                 "paper's sample lost it) or, with --backbone sage, the paper's "
                                 "n/5 per step, 5 steps (above full batch where the one-step "
                                 "sample fell below it; docs/paper_scale.md)")
    no_normalize: bool = option(False, "drop the 1/p(u) normalisation (the ablation ours*)")
    subgraph_norm: bool = option(False, "normalise each step's sample as a graph of its own: "
                                        "degrees counted inside the sample, no 1/p(u), as "
                                        "GraphSAINT without coverage weights (OGB's products "
                                        "example) and Cluster-GCN do. Biased (eq. 4 is not); "
                                        "it scored below eq. 4 on every proxy measured. Needs "
                                        "node sampling; not with --no-normalize or "
                                        "--history-every. See docs/paper_scale.md, section 9")
    exact_first_layer: bool = option(False, "the first layer aggregates every neighbour, not only "
                                            "the step's sample: its input's propagation holds no "
                                            "weight, so it is computed once at set-up (one "
                                            "full-graph exchange of the input features) and the "
                                            "sample estimates the layers above; on large graphs "
                                            "the same accuracy at about 0.6x the bytes per "
                                            "client. On with --sample-size 0 above 20,000 nodes "
                                            "(gcn, 1gnn). See docs/paper_scale.md")
    history_every: int = option(0, "R > 0: control variates from historical activations "
                                   "(VR-GCN, Chen et al. 2018) for the sampled layers: every R "
                                   "epochs one full-graph forward stores each hidden layer's "
                                   "input and its exact aggregate (one exchange per hidden "
                                   "layer), and a step samples only the change since; unbiased, "
                                   "with far less variance than eq. 4 alone. Implies "
                                   "--exact-first-layer; 0: off. For a step that must hold a "
                                   "small sample (memory): at the paper's sample fraction R = 5 "
                                   "kept centralized's score at fewer bytes than eq. 4; the "
                                   "large-graph default of gcn (one step of n draws) needs "
                                   "none. See docs/paper_scale.md, section 6")
    exchange: str = option("compact", "how the server sums the cross-client terms: " + "; ".join(
        f"{e.name} = {e.summary}" for e in EXCHANGES.values()) + ". See docs/training.md",
                           tuple(EXCHANGES))
    exchange_buffer_mb: float = option(64.0, "most MB of exchange buffers a rank holds at once: "
                                              "larger exchanges run in chunks of rows (a chunk "
                                              "holds at least one row)")
    wire_dtype: str = option("same", "the cross-client terms and sums on the wire: same (as "
                                     "--dtype, exact) or a 16-bit float, bfloat16 or float16: "
                                     "half the exchange's bytes for a rounding of every term "
                                     "and sum (summed in --dtype at the server); lossy, so not "
                                     "for the exactness claims. --exchange compact, not with "
                                     "--secure; for slow links, see docs/scale.md",
                             WIRE_DTYPES)
    secure: bool = option(False, "mask every value the server or a relaying rank handles: "
                                 "cross-client terms, weight gradients, loss and counts travel "
                                 "as fixed-point words plus pairwise keystreams (X25519 + "
                                 "AES-128-CTR, fresh keys per run, never written); --exchange "
                                 "compact and --algo ours, bns or fedgcn (its pre-training "
                                 "round and its model averages) only. See docs/privacy.md")
    steps_per_epoch: int = option(0, "optimizer steps per epoch, each on a fresh sample of "
                                     "--sample-size draws (the paper's step length); 0: one pass "
                                     "over the nodes per epoch, ceil(n / s - 1e-6) steps (4 at the "
                                     "default s = ceil(n/4)), and 1 step without node sampling or "
                                     "for the baselines")
    # Baselines (docs/algorithms.md)
    local_epochs: int = option(1, "fedavg, fedavg-nc, fedgcn: local full-batch steps per round "
                                  "(one round per epoch)")
    client_weights: str = option("train", "fedavg, fedavg-nc, fedgcn, fedsage-plus: each client's weight in the "
                                          "model average: train = its training nodes (FedAvg's "
                                          "n_k), uniform = 1 per client that has training nodes "
                                          "(FedGCN's and FedSage+'s unweighted mean)", CLIENT_WEIGHTS)
    hops: int | None = option(None, "fedgcn: what the pre-training round gives each client: 2 = "
                                    "the rows of (A + I) X of its nodes and of their one-hop "
                                    "neighbours (FedGCN 2-hop, the default), 1 = of its own "
                                    "nodes only, 0 = no round (FedAvg with FedGCN's settings)")
    round_norm: str = option("none", "fedgcn: the weights of the pre-training round's sums "
                                     "(FedGraph's norm_type, d~ = whole-graph degree + 1): none "
                                     "= (A + I) X, FedGraph's default; row = (A + I) D~^-1 X; "
                                     "sym = D~^-1/2 (A + I) D~^-1/2 X, for features whose "
                                     "unweighted sums make SGD diverge (docs/algorithms.md)",
                             ROUND_NORMS)
    nc_fraction: float = option(0.2, "fedavg-nc: fraction of one-hop cross-client neighbours each "
                                     "client collects (paper: 20%)")
    boundary_p: float = option(0.1, "bns: probability of keeping a boundary node (BNS-GCN's p)")
    replication: int = option(2, "cagnet: replication factor c of CAGNET's 1.5D algorithm: the "
                                 "m clients form m/c block rows of c ranks each, which hold the "
                                 "same rows (c times the memory, about 1/c of the broadcast "
                                 "bytes); c must divide m; 1 = CAGNET's 1D algorithm")
    # the default at TrainConfig's 2 layers; mpifgl.train sets the method's for the run's depth
    fanouts: tuple[int, ...] = option(graphsage_fanouts(2), "graphsage, llcg: neighbours sampled "
                                      "per layer, comma-separated (default: one per --layers; "
                                      "graphsage 25,10 at 2 layers, 15,10,5 at 3; llcg 10 per "
                                      "layer, the reference's)")
    batch_size: int = option(512, "graphsage: seed nodes per mini-batch; graphsaint: walk roots "
                                  "per subgraph; llcg: draws per local step (default 256)")
    walk_length: int = option(2, "graphsaint: random-walk length")
    saint_coverage: float = option(100.0, "graphsaint: pre-sample subgraphs until every node was "
                                          "drawn this many times on average, to estimate the "
                                          "paper's loss and aggregator weights (PyG's "
                                          "sample_coverage); 0: no weights, each subgraph "
                                          "normalised on its own degrees and the loss a plain "
                                          "mean over its training nodes (OGB's products example)")
    saint_layer: str = option("backbone", "graphsaint: its layer: backbone (--backbone's) or sage "
                                          "(PyG SAGEConv: mean aggregation and a root weight, the "
                                          "layer of OGB's products example and of GraphSAINT's "
                                          "own code)", ("backbone", "sage"))
    # FedSage+ (docs/algorithms.md): NeighGen, the reference's settings (zkhku/fedsage)
    neighgen_hide_from: str = option("not-train-test", "fedsage-plus: the nodes the impaired "
                                                       "graph may hide: not-train-test = neither "
                                                       "training nor test (the reference), val = "
                                                       "validation nodes (FederatedScope, "
                                                       "OpenFGL)", HIDE_RULES)
    neighgen_hidden_portion: float = option(0.5, "fedsage-plus: share of those nodes hidden, with "
                                                 "their edges, to make NeighGen's targets")
    neighgen_num_pred: int = option(5, "fedsage-plus: most neighbours generated per node (K)")
    neighgen_count_rounding: str = option("floor", "fedsage-plus: how the predicted count n^ "
                                                   "becomes generated neighbours (greedy loss, "
                                                   "mending): floor = the reference's cast to "
                                                   "int, round = FederatedScope's",
                                          ("floor", "round"))
    neighgen_hidden: int = option(32, "fedsage-plus: hidden width of NeighGen's encoder and of its "
                                      "classifier (the reference's one `hidden`)")
    neighgen_latent: int = option(128, "fedsage-plus: width of the encoder's output z, the input "
                                       "of dGen and fGen")
    neighgen_generator_widths: tuple[int, ...] = option(
        (256, 2048), "fedsage-plus: fGen's hidden widths, comma-separated (ReLU after each, "
                     "dropout after the last, then K x features with tanh)")
    neighgen_dropout: float = option(0.5, "fedsage-plus: NeighGen's dropout")
    neighgen_lr: float = option(0.001, "fedsage-plus: NeighGen's Adam learning rate (both phases)")
    neighgen_weight_decay: float = option(0.0001, "fedsage-plus: NeighGen's Adam weight decay")
    neighgen_epochs: int = option(20, "fedsage-plus: full-batch epochs of local NeighGen training "
                                      "(encoder, dGen, fGen and classifier)")
    neighgen_fed_epochs: int = option(20, "fedsage-plus: epochs of federated fGen training (the "
                                          "rest frozen): the other clients score the generated "
                                          "rows against their own features")
    neighgen_count_weight: float = option(1.0, "fedsage-plus: weight of the SmoothL1 loss of the "
                                               "hidden-neighbour count")
    neighgen_feature_weight: float = option(1.0, "fedsage-plus: weight of the greedy feature "
                                                 "losses, the other clients' included")
    neighgen_class_weight: float = option(1.0, "fedsage-plus: weight of the cross-entropy of "
                                               "NeighGen's classifier on the mended impaired graph")
    neighgen_chunk_rows: int = option(4096, "fedsage-plus: fGen runs in chunks of at most this "
                                            "many rows and 64 MB of generated rows, recomputed "
                                            "in the backward pass, so its widest layers are "
                                            "never held for every node at once (memory only; "
                                            "0: all rows at once)")
    llcg_local_steps: int = option(64, "llcg: K, neighbour-sampled Adam steps per client per "
                                       "round (one round per epoch; the reference's K = 64)")
    llcg_server_steps: int = option(1, "llcg: S, the server's correction steps per round on "
                                       "the whole graph (the reference's 1); 0: periodic "
                                       "averaging of the local steps alone")
    llcg_server_lr: float = option(1e-3, "llcg: Adam learning rate of the correction steps (the "
                                         "reference's default; its Reddit and arXiv settings "
                                         "use 1e-2)")
    llcg_server_batch_size: int = option(0, "llcg: draws per correction step; 0: --batch-size "
                                            "(the reference hands its server's neighbour sampler "
                                            "the local batch size)")
    llcg_seeds: str = option("all", "llcg: what a step draws its batch from, uniformly with "
                                    "replacement: all = every node of the graph, the loss on "
                                    "the training nodes drawn (the reference); train = the "
                                    "training nodes only", ("all", "train"))
    llcg_rho: float = option(1.0, "llcg: rho >= 1, round r runs ceil(K / rho^r) local steps "
                                  "(the reference's default 1: K every round; its Reddit "
                                  "setting 1.1)")
    llcg_grow_k: bool = option(False, "llcg: the rho schedule reversed, K_r = ceil(K / "
                                      "rho^(E-1-r)) growing to K in the last round (the "
                                      "reference's inc_k)")
    llcg_sync_moments: bool = option(True, "llcg: keep the server's own Adam moments across "
                                           "rounds instead of taking the clients' "
                                           "training-size-weighted average before the "
                                           "correction (the reference's server_opt_sync, on in "
                                           "its d2gnncor mode)",
                                     flag="--llcg-no-sync-moments")
    # Evaluation, reproducibility, outputs
    eval_every: int = option(1, "full-graph evaluation every this many epochs (the last epoch is "
                                "always evaluated)")
    seed: int = option(0, "seed for weights, sampling and dropout")
    init_seed: int = option(-1, "seed of the initial weights only; -1: --seed (two runs with the "
                                "same --init-seed and different --seed differ only in their "
                                "sampling and dropout streams)")
    dtype: str = option("float32", "floating point type of features, weights and messages", DTYPES)
    device: str = option("auto", "where each rank computes: auto (CUDA when torch sees a GPU, else "
                                 "the CPU), cpu, cuda (the node's GPUs shared out among its "
                                 "ranks) or cuda:N; see docs/hardware.md")
    threads: str = option("auto", "CPU threads per rank: auto (the cores this process may use, "
                                  "divided among the ranks of its node that share them, at "
                                  "least 1) or a number")
    feature_format: str = option("auto", "input features as dense or sparse matrices; auto: sparse "
                                         "when at most 10% of entries are non-zero",
                                 ("auto", "dense", "sparse"))
    save_logits: bool = option(False, "write logits.npy [num_nodes, num_classes] in global node "
                                      "order from the final model")
    checkpoint_every: int = option(0, "write an atomic checkpoint every K epochs (0: never)")
    resume: str = option("", "continue the run in this run directory from its last checkpoint, "
                             "in the same directory (never a finished run), or into --out")
    target_val_f1: float = option(0.0, "a validation micro-F1 in (0, 1]: final.json and the last "
                                       "line give the epoch and the seconds at which an "
                                       "evaluation first reached it (time to accuracy); 0: none")
    log_every: int = option(1, "print one line every this many epochs on rank 0")
    verbose: bool = option(False, "print the Python traceback with an error message (without it: "
                                  "one line naming the rank, the file and the reason)")
    watchdog_seconds: str = option(
        "auto", "seconds a rank may wait in one collective before it asks every rank whether "
                "it is there; a rank that does not answer within "
                f"{ANSWER_SECONDS:.0f} s (stopped, swapping, its node lost) ends the job with "
                "one line naming it (a busy rank answers: a long evaluation or checkpoint is "
                f"no stall). auto: {SETUP_SECONDS:.0f} s until the first epoch ends, then the "
                f"larger of {FLOOR_SECONDS:.0f} s and {EPOCHS_OF_TIMEOUT} times the longest "
                "epoch; 0: off (see docs/reliability.md)")

    def validate(self) -> None:
        """Raise ValueError naming the flag, the value found and the value expected."""
        def need(ok: bool, flag: str, value: Any, expected: str) -> None:
            if not ok:
                raise ValueError(f"--{flag} is {value!r}, expected {expected}")
        check_finite(self)  # every float flag is a finite number (NaN fails no range check)
        for name in ("algo", "backbone", "sampling", "exchange", "dtype", "feature_format",
                     "saint_layer", "optimizer", "client_weights", "neighgen_hide_from",
                     "neighgen_count_rounding", "llcg_seeds"):
            choices = _choices(name)
            need(getattr(self, name) in choices, name.replace("_", "-"), getattr(self, name),
                 f"one of {', '.join(choices)}")
        need(self.layers >= 1, "layers", self.layers, "an integer >= 1")
        need(self.hidden >= 1, "hidden", self.hidden, "an integer >= 1")
        need(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "a probability in [0, 1)")
        need(self.lr > 0, "lr", self.lr, "a positive number")
        need(self.weight_decay >= 0, "weight-decay", self.weight_decay, "a number >= 0")
        need(self.epochs >= 1, "epochs", self.epochs, "an integer >= 1 (a run trains at least "
             "one epoch; its final.json would otherwise report an untrained model)")
        need(self.exchange_buffer_mb > 0, "exchange-buffer-mb", self.exchange_buffer_mb,
             "a positive number of MB")
        if self.secure and self.algo not in SECURE_ALGOS:
            raise ValueError(f"--secure with --algo {self.algo!r}: masking protects the "
                             f"cross-client exchange of {', '.join(SECURE_ALGOS)}; expected "
                             f"--algo one of {', '.join(SECURE_ALGOS)} (the others exchange no "
                             "per-layer terms, or run in one process)")
        if self.secure and self.exchange not in SECURE_EXCHANGES:
            raise ValueError(f"--secure with --exchange {self.exchange!r}: expected --exchange "
                             "compact (the dense and Reduce-tree modes are not masked; "
                             "docs/privacy.md says why)")
        if self.wire_dtype != "same":
            need(self.wire_dtype in WIRE_DTYPES, "wire-dtype", self.wire_dtype,
                 f"one of {', '.join(WIRE_DTYPES)}")
            if self.exchange not in NARROW_WIRE_EXCHANGES or self.secure:
                raise ValueError(f"--wire-dtype {self.wire_dtype} with "
                                 f"{'--secure' if self.secure else '--exchange ' + self.exchange}"
                                 f": expected --exchange one of "
                                 f"{', '.join(NARROW_WIRE_EXCHANGES)} without --secure (a "
                                 "16-bit term cannot be summed by MPI or masked)")
        if self.exact_first_layer and self.algo not in EXACT_FIRST_ALGOS:
            raise ValueError(f"--exact-first-layer with --algo {self.algo!r}: expected --algo "
                             f"one of {', '.join(EXACT_FIRST_ALGOS)} (the methods that train "
                             "the whole-graph model; the others aggregate their own way)")
        need(self.history_every >= 0, "history-every", self.history_every,
             "an integer >= 0 (epochs between refreshes; 0: off)")
        if self.history_every and self.algo not in EXACT_FIRST_ALGOS:
            raise ValueError(f"--history-every with --algo {self.algo!r}: expected --algo one of "
                             f"{', '.join(EXACT_FIRST_ALGOS)} (the methods that train the "
                             "whole-graph model)")
        if self.history_every and self.sampling == "none" and self.algo != "bns":
            raise ValueError("--history-every with --sampling none: expected --sampling label "
                             "or uniform (control variates correct a sampled layer; a full-graph "
                             "step has none)")
        clash = None if not self.subgraph_norm else (
            "--no-normalize" if self.no_normalize else
            f"--history-every {self.history_every}" if self.history_every else
            f"--algo {self.algo}" if self.algo not in EXACT_FIRST_ALGOS else
            "--sampling none" if self.sampling == "none" and self.algo != "bns" else None)
        if clash:
            raise ValueError(f"--subgraph-norm with {clash}: expected node sampling (--sampling "
                             "label or uniform, or --algo bns) without --no-normalize or "
                             "--history-every (a sample normalises one way; control variates "
                             "need eq. 4's unbiased estimate), with --algo one of "
                             f"{', '.join(EXACT_FIRST_ALGOS)}")
        need(self.sample_size >= 0, "sample-size", self.sample_size, "an integer >= 0")
        need(self.steps_per_epoch >= 0, "steps-per-epoch", self.steps_per_epoch,
             "an integer >= 1, or 0 for one pass over the nodes per epoch")
        need(self.eval_every >= 1, "eval-every", self.eval_every, "an integer >= 1")
        need(self.seed >= 0, "seed", self.seed, "an integer >= 0")
        need(self.init_seed >= -1, "init-seed", self.init_seed, "an integer >= 0, or -1")
        need(self.checkpoint_every >= 0, "checkpoint-every", self.checkpoint_every,
             "an integer >= 0")
        need(self.log_every >= 1, "log-every", self.log_every, "an integer >= 1")
        check_device_spec(self.device)
        parse_threads(self.threads)
        parse_watchdog_seconds(self.watchdog_seconds)
        need(self.local_epochs >= 1, "local-epochs", self.local_epochs, "an integer >= 1")
        self._validate_rounds()
        need(0.0 <= self.nc_fraction <= 1.0, "nc-fraction", self.nc_fraction, "a fraction in [0, 1]")
        need(0.0 < self.boundary_p <= 1.0, "boundary-p", self.boundary_p, "a probability in (0, 1]")
        need(self.replication >= 1, "replication", self.replication, "an integer >= 1")
        need(0.0 <= self.target_val_f1 <= 1.0, "target-val-f1", self.target_val_f1,
             "a micro-F1 in (0, 1], or 0 for none")
        if self.algo == CAGNET_ALGO:
            need(self.backbone == "gcn", "backbone", self.backbone,
                 "gcn with --algo cagnet (CAGNET trains GCN layers)")
        need(self.batch_size >= 1, "batch-size", self.batch_size, "an integer >= 1")
        need(self.walk_length >= 1, "walk-length", self.walk_length, "an integer >= 1")
        need(self.saint_coverage >= 0, "saint-coverage", self.saint_coverage, "a number >= 0")
        need(bool(self.fanouts) and all(v >= 1 for v in self.fanouts), "fanouts",
             ",".join(map(str, self.fanouts)),
             "comma-separated integers >= 1, one per layer (e.g. 25,10)")
        need(0.0 <= self.neighgen_hidden_portion <= 1.0, "neighgen-hidden-portion",
             self.neighgen_hidden_portion, "a fraction in [0, 1]")
        for name in ("neighgen_num_pred", "neighgen_hidden", "neighgen_latent"):
            need(getattr(self, name) >= 1, name.replace("_", "-"), getattr(self, name),
                 "an integer >= 1")
        need(bool(self.neighgen_generator_widths) and
             all(v >= 1 for v in self.neighgen_generator_widths), "neighgen-generator-widths",
             ",".join(map(str, self.neighgen_generator_widths)),
             "comma-separated integers >= 1 (e.g. 256,2048)")
        need(0.0 <= self.neighgen_dropout < 1.0, "neighgen-dropout", self.neighgen_dropout,
             "a probability in [0, 1)")
        need(self.neighgen_lr > 0, "neighgen-lr", self.neighgen_lr, "a positive number")
        for name in ("neighgen_weight_decay", "neighgen_count_weight", "neighgen_feature_weight",
                     "neighgen_class_weight"):
            need(getattr(self, name) >= 0, name.replace("_", "-"), getattr(self, name),
                 "a number >= 0")
        for name in ("neighgen_epochs", "neighgen_fed_epochs", "neighgen_chunk_rows"):
            need(getattr(self, name) >= 0, name.replace("_", "-"), getattr(self, name),
                 "an integer >= 0")

        need(self.llcg_local_steps >= 1, "llcg-local-steps", self.llcg_local_steps,
             "an integer >= 1")
        need(self.llcg_server_steps >= 0, "llcg-server-steps", self.llcg_server_steps,
             "an integer >= 0 (0: no correction)")
        need(self.llcg_server_lr > 0, "llcg-server-lr", self.llcg_server_lr, "a positive number")
        need(self.llcg_server_batch_size >= 0, "llcg-server-batch-size",
             self.llcg_server_batch_size, "an integer >= 1, or 0 for --batch-size")
        need(self.llcg_rho >= 1.0, "llcg-rho", self.llcg_rho, "a number >= 1 (K / rho^r "
             "shrinks K; below 1 it would grow without bound: --llcg-grow-k grows it to K)")
        per_depth = METHODS[self.algo].fanouts_at_depth
        if per_depth is not None:  # the method's default follows --layers; a value given must too
            need(len(self.fanouts) == self.layers, "fanouts", ",".join(map(str, self.fanouts)),
                 f"one value per layer with --algo {self.algo} (--layers {self.layers}: e.g. "
                 f"{','.join(map(str, per_depth(self.layers)))})")

    def check_method_settings(self) -> None:
        """Raise ValueError where a flag clashes with the method (checked once the method's
        defaults are applied: ``mpifgl.registry.Method.default_changes``)."""
        if self.algo == CAGNET_ALGO and self.sampling != "none":
            raise ValueError(f"--sampling is {self.sampling!r}, expected none with --algo "
                             "cagnet (CAGNET is exact full-batch training)")

    def check_clients(self, num_clients: int, shards: str) -> None:
        """Raise ValueError where a flag does not fit the shards' number of clients (checked
        once the manifest is read, on every rank alike)."""
        if self.algo == CAGNET_ALGO and num_clients % self.replication:
            divisors = [c for c in range(1, num_clients + 1) if num_clients % c == 0]
            raise ValueError(f"--replication is {self.replication}, expected a divisor of the "
                             f"{num_clients} clients of {shards}: one of "
                             f"{', '.join(map(str, divisors))}")

    def _validate_rounds(self) -> None:
        """The flags of the model-averaging methods and of FedGCN's pre-training round."""
        if self.client_weights != "train" and self.algo not in AVERAGING_ALGOS:
            raise ValueError(f"--client-weights {self.client_weights} with --algo {self.algo!r}: "
                             f"expected --algo one of {', '.join(AVERAGING_ALGOS)} (the methods "
                             "that average client models)")
        if self.hops is not None and self.algo not in ROUND_ALGOS:
            raise ValueError(f"--hops with --algo {self.algo!r}: expected --algo one of "
                             f"{', '.join(ROUND_ALGOS)} (the methods with a pre-training round)")
        if self.round_norm != "none" and self.algo not in ROUND_ALGOS:
            raise ValueError(f"--round-norm {self.round_norm} with --algo {self.algo!r}: "
                             f"expected --algo one of {', '.join(ROUND_ALGOS)} (the methods "
                             "with a pre-training round)")
        if self.algo not in ROUND_ALGOS:
            return
        hops = self.hops if self.hops is not None else METHODS[self.algo].default("hops")
        if hops not in HOPS:
            raise ValueError(f"--hops is {hops!r}, expected one of "
                             f"{', '.join(map(str, HOPS))}")
        if hops == 0 and self.round_norm != "none":
            raise ValueError(f"--round-norm {self.round_norm} with --hops 0: expected --hops 1 "
                             "or 2 (at 0 hops there is no round to weight)")
        if hops > 0 and self.layers < 2:
            raise ValueError(f"--layers {self.layers} with --algo {self.algo} --hops {hops}: "
                             "expected --layers >= 2 (a linear layer on the pre-aggregated rows, "
                             "then at least one graph layer)")
        if hops > 0 and self.exchange not in SECURE_EXCHANGES:
            raise ValueError(f"--exchange {self.exchange} with --algo {self.algo}: expected "
                             f"--exchange {' or '.join(SECURE_EXCHANGES)} (the round sends rows "
                             "with their ids to the server alone, which sums them; no other "
                             "rank may see a partial sum)")

    @property
    def weight_seed(self) -> int:
        """Seed of the initial weights: --init-seed, else --seed."""
        return self.init_seed if self.init_seed >= 0 else self.seed

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        """A saved config (checkpoint or config.json): JSON's lists become the tuple fields'
        tuples, and a run saved when --fanouts was kept as its text ("25,10") still loads."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if k in known}
        if isinstance(values.get("fanouts"), str):
            values["fanouts"] = CommaSeparated(int)(values["fanouts"])
        for f in fields(cls):  # JSON's lists back to the tuple fields' tuples
            if isinstance(f.default, tuple) and isinstance(values.get(f.name), list):
                values[f.name] = tuple(values[f.name])
        return cls(**values)


def parse_threads(spec: str) -> int:
    """0 for ``auto``, else the number; ValueError naming the flag otherwise."""
    if spec == "auto":
        return 0
    if spec.isdigit() and int(spec) >= 1:
        return int(spec)
    raise ValueError(f"--threads is {spec!r}, expected auto or an integer >= 1")


def parse_watchdog_seconds(spec: str) -> float | None:
    """None for ``auto``, else the seconds (0: off); ValueError naming the flag otherwise."""
    if spec == "auto":
        return None
    try:
        seconds = float(spec)
    except ValueError:
        seconds = float("nan")
    if seconds >= 0 and seconds != float("inf"):
        return seconds
    raise ValueError(f"--watchdog-seconds is {spec!r}, expected auto, 0 (off) or a number of "
                     f"seconds > 0")


def check_device_spec(spec: str) -> None:
    """ValueError naming the flag for a device that is not auto, cpu, cuda or cuda:N."""
    if spec in ("auto", "cpu", "cuda") or (spec.startswith("cuda:") and spec[5:].isdigit()):
        return
    raise ValueError(f"--device is {spec!r}, expected one of auto, cpu, cuda, cuda:N")


def _choices(name: str) -> tuple[str, ...]:
    return next(f.metadata["choices"] for f in fields(TrainConfig) if f.name == name)


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field: --field-name, typed from the annotation."""
    parser = argparse.ArgumentParser(
        prog="python -m mpifgl.train",
        description="Train a GNN over MPI: rank 0 is the server, ranks 1..m serve client_{0..m-1}.h5."
                    " Launch with `mpirun -n M+1 python -m mpifgl.train --shards DIR`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataclass_arguments(parser, TrainConfig)
    return parser


# Flags a resumed run may change: they alter how long it runs and what it writes, not the math
# (the exchange's buffer cap only cuts the same sums into other chunks: a resume on a machine
# with less memory needs it).
RESUME_OVERRIDABLE = ("epochs", "eval_every", "log_every", "checkpoint_every", "save_logits",
                      "resume", "out", "force", "verbose", "exchange_buffer_mb", "device",
                      "threads", "watchdog_seconds")
# Flags a resumed run may change only to a value proven the same: shards moved elsewhere
# (--shards NEW), whose fingerprint must equal the checkpoint's (mpifgl.train checks it).
RESUME_PROVEN = ("shards",)
# Flags naming files: saved resolved (absolute), compared resolved, so a resume works from any
# working directory and accepts the same directory spelled differently.
PATH_FLAGS = ("shards", "data_root")


def resolved_path(value: str) -> str:
    """An absolute path with symlinks resolved; empty stays empty (the flag's default)."""
    return str(Path(value).resolve()) if value else value


def resumes_in_place(config: TrainConfig) -> bool:
    """--resume X continues in X itself (no --out, or --out X), not into a new directory."""
    return bool(config.resume) and (not config.out or
                                    os.path.abspath(config.out) == os.path.abspath(config.resume))


def resumed_config(saved: dict[str, Any], given: TrainConfig, explicit: set[str],
                   checkpoint_epoch: int = 0) -> TrainConfig:
    """The saved config of the run being resumed, with the few flags a resume may change.
    ``--out Y`` continues into Y (X is only read); without it the run continues in X. A resume
    never ends before its checkpoint's epoch: ``--epochs`` below it is refused."""
    config = TrainConfig.from_dict(saved)
    given = given.replace(**{name: resolved_path(getattr(given, name)) for name in PATH_FLAGS})
    may_change = set(RESUME_OVERRIDABLE) | set(RESUME_PROVEN)
    changed = sorted(name for name in explicit - may_change
                     if getattr(given, name) != getattr(config, name))
    if changed:
        flags = ", ".join(f"--{n.replace('_', '-')} {getattr(given, n)!r} (run has "
                          f"{getattr(config, n)!r})" for n in changed)
        raise ValueError(f"--resume continues a run with its own settings; these flags differ: "
                         f"{flags}. Only {', '.join('--' + n.replace('_', '-') for n in RESUME_OVERRIDABLE)} may change "
                         f"(and --shards, to the same shards moved elsewhere)")
    overrides = {name: getattr(given, name) for name in explicit & may_change}
    epochs = overrides.get("epochs", config.epochs)
    if epochs < checkpoint_epoch:
        raise ValueError(f"--epochs is {epochs}, expected at least {checkpoint_epoch}: the "
                         f"checkpoint in {given.resume} is of epoch {checkpoint_epoch} and a "
                         f"resume trains on from there (--epochs {checkpoint_epoch} writes the "
                         f"final files of that model without training further)")
    into = given.out if "out" in explicit and given.out else given.resume
    overrides.update(resume=given.resume, out=into,
                     force=given.force and not resumes_in_place(given.replace(out=into)))
    return config.replace(**overrides)


# Flags that say where a run writes or how it reports, not what it computes: left out of a
# command that starts a run again.
NOT_RESTARTED = ("out", "resume", "force", "verbose", "dataset", "data_root")


def restart_command(config: TrainConfig, world_size: int, out: str) -> str:
    """The shell command that starts ``config``'s run again from nothing into ``out`` (--force:
    the directory holds the failed attempt), quoted for pasting."""
    defaults = TrainConfig()
    words = ["python", "-m", "mpifgl.train"]
    for f in fields(TrainConfig):
        value = getattr(config, f.name)
        if f.name in NOT_RESTARTED or value == getattr(defaults, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag)
        else:
            words += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    if not config.shards:  # the default run: which dataset it prepared
        words += ["--dataset", config.dataset] + (["--data-root", config.data_root]
                                                   if config.data_root else [])
    launch = ["mpirun", "-n", str(world_size)] if world_size > 1 else []
    return shlex.join(launch + words + ["--out", out, "--force"])


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    return dataclass_from_namespace(TrainConfig, build_parser().parse_args(argv))
