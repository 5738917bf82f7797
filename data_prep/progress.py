"""Progress of the long offline stages on stderr, drawn by tqdm; silent unless asked for.

A stage with a count (edges sampled, shards written) is a bar of that count; a stage without one
(loading, partitioning) is a bar of one step, so its line still names it and shows its time."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from tqdm import tqdm

PREFIX = "data_prep: "
LOG_INTERVAL_SECONDS = 5.0  # not a terminal (a job's log file): a line at most this often


def bar(label: str, total: int, show: bool, **options: Any) -> tqdm:
    """A bar counting ``total`` items of the stage ``label``; ``update(k)`` advances it."""
    on_terminal = sys.stderr.isatty()
    return tqdm(total=total, desc=PREFIX + label, disable=not show, file=sys.stderr,
                mininterval=0.1 if on_terminal else LOG_INTERVAL_SECONDS,
                dynamic_ncols=on_terminal, unit_scale=True, **options)


@contextlib.contextmanager
def stage(label: str, show: bool) -> Iterator[None]:
    """A stage without a count: 0% while it runs, 100% when the block ends without an error."""
    with bar(label, 1, show, bar_format="{desc}: {percentage:.0f}% [{elapsed}]") as one:
        yield
        one.update(1)


def warn(message: str) -> None:
    """One line on stderr, also with --quiet: what a run did that the user must know of."""
    print(f"{PREFIX}warning: {message}", file=sys.stderr, flush=True)
