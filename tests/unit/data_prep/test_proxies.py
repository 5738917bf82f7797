"""The proxy presets: the real graph's shape scaled, the paper's sample size scaled with it, and
``--syn-proxy`` expanding to --syn-* flags that explicit flags override. No training."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from data_prep.config import SyntheticConfig
from data_prep.proxies import PROXIES, proxy, proxy_flags, proxy_options

from tests.helpers.data_prep_fixtures import run_cli


def test_presets_hold_the_real_graphs_shape():
    products, reddit = proxy("products").config(), proxy("reddit").config()
    assert (products.nodes, products.num_edges, products.features, products.classes) == (
        2_449_029, 61_859_140, 100, 47)
    assert (reddit.nodes, reddit.num_edges, reddit.features, reddit.classes) == (
        232_965, 11_606_919, 602, 41)
    assert products.fractions == pytest.approx((0.0803, 0.0161, 0.9036))
    assert reddit.fractions == pytest.approx((0.6586, 0.1023, 0.2391))
    for spec in PROXIES.values():
        spec.config(0.1).validate()
        assert spec.real in ("products", "reddit")


def test_headroom_preset_is_products_with_a_higher_ceiling():
    products, headroom = proxy("products"), proxy("products-headroom")
    same = ("nodes", "num_edges", "features", "classes", "fractions")
    assert [getattr(headroom.config(0.1), f) for f in same] == [
        getattr(products.config(0.1), f) for f in same]
    assert headroom.sample_size_at(0.1) == products.sample_size_at(0.1)
    # a relabelled node keeps its label with chance about 0.082 (47 Zipf classes)
    ceiling = {p.name: 1 - p.knobs["label_noise"] * (1 - 0.082) for p in (products, headroom)}
    assert ceiling["products"] < 0.78 and ceiling["products-headroom"] > 0.9


def test_popularity_preset_is_the_headroom_graph_split_by_degree():
    headroom, popular = proxy("products-headroom").config(0.01, 0), proxy(
        "products-popularity").config(0.01, 0)
    assert (headroom.split_by, popular.split_by) == ("class", "popularity")
    assert replace(popular, split_by="class") == headroom  # the same graph, other masks


def test_scale_keeps_the_degree_and_the_sample_fraction():
    spec = proxy("products")
    tenth = spec.config(0.1)
    assert (tenth.nodes, tenth.num_edges) == (244_903, 6_185_914)
    assert spec.sample_size_at(0.1) == 50_000  # 500,000 of 2,449,029 nodes, scaled
    assert proxy("reddit").sample_size_at(0.1) == 5_000  # 50,000 of 232,965
    assert spec.sample_size_at(1.0) == 500_000
    with pytest.raises(ValueError, match="--syn-scale must be in"):
        spec.config(0.0)
    with pytest.raises(ValueError, match="unknown --syn-proxy 'arxiv'"):
        proxy("arxiv")


def test_options_and_flags_say_the_same():
    options = proxy_options("reddit", 0.01, label_noise=0.5)
    assert options["syn_nodes"] == 2330 and options["syn_label_noise"] == 0.5
    assert options["syn_split"] == (0.6586, 0.1023)
    assert SyntheticConfig(**{k[4:]: v for k, v in options.items()}).num_edges == 116_069
    flags = proxy_flags("reddit", 0.01, label_noise=0.5)
    assert "--syn-split=0.6586,0.1023" in flags and "--syn-label-noise=0.5" in flags


def test_cli_preset_with_an_override(tmp_path, isolated_cache, capsys):
    out = tmp_path / "shards"
    status, _, stderr = run_cli(capsys, "--dataset", "synthetic", "--syn-proxy", "reddit",
                                "--syn-scale", "0.002", "--syn-features", "8",
                                "--num-clients", "2", "--out", out, "--quiet")
    assert status == 0, stderr
    recorded = json.loads((out / "manifest.json").read_text())["request"]["synthetic"]
    expected = proxy("reddit").config(0.002).as_dict()
    assert recorded["features"] == 8  # the explicit flag wins
    for name in ("nodes", "edges", "classes", "homophily", "feature_signal", "label_noise",
                 "split"):
        assert recorded[name] == expected[name], name


def test_cli_scale_needs_a_preset(tmp_path, capsys):
    status, _, stderr = run_cli(capsys, "--dataset", "synthetic", "--syn-scale", "0.5",
                                "--num-clients", "2", "--out", tmp_path / "o")
    assert status == 2 and "--syn-scale 0.5 needs --syn-proxy" in stderr
