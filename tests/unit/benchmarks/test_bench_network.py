"""benchmarks/bench_network.py's arithmetic: rates, the cost model and the merge of rounds; and
the tbf settings of the namespace hosts it shapes (tests/helpers/netns.py)."""
from __future__ import annotations

import pytest

from benchmarks.bench_network import Run, merge_rounds, parse_rate, predict, rate_label
from tests.helpers.netns import tbf_arguments


def test_rates_read_and_print_in_bits_per_second():
    assert [parse_rate(r) for r in ("25g", "10G", "1g", "100m", "64k")] == \
        [25e9, 10e9, 1e9, 1e8, 64e3]
    assert [rate_label(r) for r in (None, 25e9, 1e8)] == ["unshaped", "25 Gb/s", "100 Mb/s"]
    with pytest.raises(ValueError, match="--rates '100x': expected a number"):
        parse_rate("100x")


def test_the_model_is_the_unshaped_compute_plus_bytes_over_bandwidth_plus_latencies():
    probes = {None: {"latency_seconds": 0.001, "bandwidth_bytes_per_second": 1e9},
              1e8: {"latency_seconds": 0.002, "bandwidth_bytes_per_second": 1e7}}
    unshaped = Run("ours", None, epoch_seconds=[2.0], link_bytes=[1e8], collectives=[100])
    shaped = Run("ours", 1e8, epoch_seconds=[12.0], link_bytes=[1e8], collectives=[100])
    failed = Run("fedavg", 1e8, status="failed (exit 1)")
    compute = predict([unshaped, shaped, failed], probes)
    assert compute == {"ours": pytest.approx(2.0 - 0.1 - 0.1)}
    assert unshaped.predicted == pytest.approx(2.0)
    assert shaped.predicted == pytest.approx(1.8 + 10.0 + 0.2)
    assert failed.predicted is None


def test_rounds_merge_per_method_and_rate_in_table_order():
    runs = [Run("fedavg", 1e8, epoch_seconds=[1.0]), Run("ours", 1e8, epoch_seconds=[3.0]),
            Run("ours", None, epoch_seconds=[2.0]), Run("ours", 1e8, epoch_seconds=[5.0]),
            Run("ours", 1e9, status="failed (exit 9)")]
    merged = merge_rounds(runs)
    assert [(r.method, r.rate) for r in merged] == [("ours", None), ("ours", 1e9),
                                                    ("ours", 1e8), ("fedavg", 1e8)]
    assert merged[2].epoch_seconds == [3.0, 5.0] and merged[2].steady("epoch_seconds") == 4.0
    assert merged[1].status == "failed (exit 9)"


def test_tbf_gets_a_bucket_and_a_queue_that_fit_the_rate():
    def settings(rate):
        words = tbf_arguments(rate)
        return {words[k]: words[k + 1] for k in range(1, len(words), 2)}
    slow, fast = settings(1e8), settings(25e9)
    assert slow == {"rate": "100000000bit", "burst": str(64 * 1024), "limit": str(2 ** 20)}
    assert fast["rate"] == "25000000000bit"
    assert int(fast["burst"]) == 25e9 / 8 / 1000  # a millisecond at the rate
    assert int(fast["limit"]) == 25e9 / 8 * 0.05
