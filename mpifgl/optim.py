"""Adam and plain SGD, step for step the arithmetic of ``torch.optim.Adam`` and
``torch.optim.SGD`` on CPU (their single-tensor paths, L2 weight decay added to the gradient),
without their start-up cost. ``--optimizer`` picks one (``mpifgl.registry.OPTIMIZERS``).

Why not torch.optim.Adam: constructing any ``torch.optim.Optimizer`` imports ``torch._dynamo``
(sympy, the FX tracer, FSDP, ...), seconds of start-up per rank that were most of a short run's
wall time (docs/training.md). Nothing here needs the compiler. ``tests/unit/mpifgl/test_optim.py`` checks
bit-identical parameters against torch.optim.Adam and torch.optim.SGD.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch


def _check_settings(name: str, lr: float, weight_decay: float) -> None:
    if lr <= 0.0:
        raise ValueError(f"{name} lr {lr}: expected a positive number")
    if weight_decay < 0.0:
        raise ValueError(f"{name} weight_decay {weight_decay}: expected >= 0")


class Adam:
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        _check_settings("Adam", lr, weight_decay)
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), betas, eps, weight_decay
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format)
                        for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format)
                           for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:  # as torch does: grads may be views
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient. torch keeps one step counter per
        parameter; all of ours step together, so one counter is the same thing."""
        beta1, beta2 = self.betas
        self.step_count += 1
        step = float(self.step_count)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        step_size = self.lr / bias_correction1
        for param, exp_avg, exp_avg_sq in zip(self.params, self.exp_avg, self.exp_avg_sq):
            grad = param.grad
            if grad is None:
                continue
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step_count, "exp_avg": [t.clone() for t in self.exp_avg],
                "exp_avg_sq": [t.clone() for t in self.exp_avg_sq],
                "hyper": {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                          "weight_decay": self.weight_decay}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        shapes = [tuple(p.shape) for p in self.params]
        found = [tuple(t.shape) for t in state.get("exp_avg", [])]
        if found != shapes:
            raise ValueError(f"optimizer state holds moments of shapes {found}, expected "
                             f"{shapes} (a checkpoint of another model?)")
        self.step_count = int(state["step"])
        for mine, theirs in zip(self.exp_avg + self.exp_avg_sq,
                                list(state["exp_avg"]) + list(state["exp_avg_sq"])):
            mine.copy_(theirs)


class SGD:
    """Stochastic gradient descent without momentum (FedGCN's optimizer): p -= lr * (g + wd * p).
    It keeps no state between steps, so a client's "own optimizer" is only its settings."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 weight_decay: float = 0.0):
        _check_settings("SGD", lr, weight_decay)
        self.params = list(params)
        self.lr, self.weight_decay = float(lr), weight_decay
        self.step_count = 0

    zero_grad = Adam.zero_grad

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        for param in self.params:
            grad = param.grad
            if grad is None:
                continue
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            param.add_(grad, alpha=-self.lr)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step_count, "sgd": True,
                "hyper": {"lr": self.lr, "weight_decay": self.weight_decay}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state.get("sgd"):
            raise ValueError("optimizer state of another optimizer (Adam moments?), expected "
                             "SGD's (a checkpoint written with another --optimizer?)")
        self.step_count = int(state["step"])
