"""The simulated engine as its own process (`specsweep serve-sim` on 127.0.0.1, an ephemeral port), for tests that
need what `serve` does beyond the app (its runner, its heap) or a server on a core of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sim_process(*extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start `serve-sim --profile demo` with `extra` options; yield (process, base URL); always stop it, also when
    the test fails. Not starting is a failure (RuntimeError), never a skip: the simulator is the project's own."""
    argv = [sys.executable, "-m", "specsweep", "serve-sim", "--host", "127.0.0.1", "--port", "0", "--profile", "demo"]
    proc = subprocess.Popen([*argv, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "specsweep-sim listening on http://127.0.0.1:PORT ..."
        m = re.search(r"http://[\d.]+:(\d+)", line)
        if not m:
            rest = proc.stdout.read() if proc.poll() is not None else ""
            raise RuntimeError(f"simulated engine did not start: {line}{rest}")
        yield proc, f"http://127.0.0.1:{m.group(1)}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
