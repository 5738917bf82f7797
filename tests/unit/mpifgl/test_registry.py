"""mpifgl.registry: every entry builds what it names, the configuration offers exactly the
registry's names, and the modules that must not know about communication do not import it."""
from __future__ import annotations

import ast

import pytest
import torch

from mpifgl.config import SECURE_ALGOS, SECURE_EXCHANGES, TrainConfig, build_parser
from mpifgl.exchange.base import Exchange
from mpifgl.model import GraphLayer
from mpifgl.registry import BACKBONES, EXCHANGES, METHODS, OPTIMIZERS, SAMPLINGS, lookup
from tests.helpers import REPO
from tests.helpers.thread_comm import ThreadComm, ThreadWorld
from tests.unit.test_package_arrows import loaded_at_import


def choices_of(flag: str) -> tuple[str, ...]:
    action = next(a for a in build_parser()._actions if f"--{flag}" in a.option_strings)
    return tuple(action.choices)


def test_the_flags_offer_exactly_the_registrys_names():
    assert choices_of("algo") == tuple(METHODS)
    assert choices_of("backbone") == tuple(BACKBONES)
    assert choices_of("exchange") == tuple(EXCHANGES)
    assert choices_of("sampling") == tuple(SAMPLINGS)
    assert choices_of("optimizer") == tuple(OPTIMIZERS)
    assert SECURE_ALGOS == ("ours", "bns", "fedgcn") and SECURE_EXCHANGES == ("compact",)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_entry_loads_a_builder(name):
    assert callable(METHODS[name].load())


@pytest.mark.parametrize("name", list(BACKBONES))
def test_every_backbone_entry_is_a_layer_with_its_scales(name):
    layer_type = BACKBONES[name].load()
    assert issubclass(layer_type, GraphLayer)
    layer = layer_type(4, 3)
    assert layer.propagated_widths() == [3] and layer.out_dim == 3
    degree, p = torch.tensor([0.0, 3.0]), torch.tensor([1.0, 0.5])
    scales = layer_type.scales(degree, p)
    assert all(v.shape == (2,) for v in (scales.row, scales.col, scales.self))
    out = layer(torch.ones(2, 4), _identity_operator(2))
    assert out.shape == (2, 3)


def _identity_operator(k: int):
    import scipy.sparse as sp
    from mpifgl.model import LayerOperator
    from mpifgl.operators import SparseOperator
    one = torch.ones(k, 1)
    return LayerOperator(torch.arange(k), SparseOperator(sp.identity(k, format="csr"),
                                                         torch.float32), one, one, one)


@pytest.mark.parametrize("name", list(EXCHANGES))
def test_every_exchange_entry_builds_an_exchange(name):
    exchange = EXCHANGES[name].load()(ThreadComm(ThreadWorld(2), 1), 1 << 20, 8, torch.float32)
    assert isinstance(exchange, Exchange)


@pytest.mark.parametrize("name", [n for n, e in SAMPLINGS.items() if e.path])
def test_every_drawing_sampling_entry_loads_a_distribution(name):
    import numpy as np
    groups, counts = np.asarray([0, 1, 1]), np.asarray([5, 5])
    q = SAMPLINGS[name].load()(groups, counts)
    assert q.shape == (3,) and abs(q.sum() - 1) < 1e-12


def test_lookup_names_the_flag_and_the_choices():
    with pytest.raises(ValueError, match="--backbone 'gat', expected one of gcn, 1gnn"):
        lookup(BACKBONES, "backbone", "gat")
    with pytest.raises(ValueError, match="--algo is 'x', expected one of ours, centralized"):
        TrainConfig(algo="x").validate()


def test_config_holds_no_literal_list_of_methods_or_modes():
    """The choices come from the registry: no tuple of method, backbone or exchange names is
    written in mpifgl/config.py."""
    names = set(METHODS) | set(BACKBONES) | set(EXCHANGES) | set(SAMPLINGS) | set(OPTIMIZERS)
    tree = ast.parse((REPO / "mpifgl" / "config.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List)):
            literal = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            assert len(literal & names) < 2, f"a literal list of names: {sorted(literal)}"


def test_the_model_imports_no_communication():
    """Importing the model loads none of the exchange, masking or communicator modules."""
    loaded = loaded_at_import("mpifgl.model")
    assert not {m for m in loaded if m.startswith(("mpifgl.exchange", "mpifgl.secure",
                                                    "mpifgl.comm", "mpifgl.keys"))}
    assert "mpi4py" not in {m.split(".")[0] for m in loaded}


def test_the_registry_imports_no_module_of_the_program():
    """mpifgl.config reads the registry, so the registry names no mpifgl module, not even for
    typing: the two would import each other."""
    from tests.unit.test_package_arrows import imported_modules

    assert not {m for m in imported_modules(REPO / "mpifgl" / "registry.py")
                if m.split(".")[0] == "mpifgl"}


def test_a_methods_defaults_apply_only_to_the_flags_not_given():
    centralized = METHODS["centralized"]
    assert centralized.default_changes(set(), 2) == {"sampling": "none"}
    assert centralized.default_changes({"sampling"}, 2) == {}
    assert METHODS["ours"].default_changes(set(), 2) == {}
