"""Faults during a cell, injected by the simulated engine: each is counted, explained, and never hangs."""

from __future__ import annotations

import socket

import pandas as pd
import pytest

from specsweep.measure.metrics import aborted
from specsweep.serving.servers import ServerError
from tests.conftest import sim_server_processes
from tests.faults.conftest import tiny_config

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


def records(runner, name: str = "cell") -> pd.DataFrame:
    return pd.read_parquet(runner.out_dir(name) / "requests.parquet")


def test_http_errors_are_counted_and_invalidate(cells) -> None:
    summary = cells.run(tiny_config(sim_args=["--fault-http-error-fraction", "0.3"]))
    errors = summary["metrics"]["errors"]
    assert errors["by_kind"].get("http", 0) >= 1
    assert any("500" in m for m in errors["messages"]["http"])
    assert not summary["validity"]["valid"]
    assert any("error rate" in r for r in summary["validity"]["reasons"])
    df = records(cells)
    assert (df.loc[~df["ok"] & ~aborted(df), "error_kind"] == "http").all()


def test_error_threshold_tolerates_below(cells) -> None:
    cfg = tiny_config(sim_args=["--fault-http-error-fraction", "0.1"])
    cfg["gates"]["max_error_rate"] = 0.9
    summary = cells.run(cfg)
    assert not any("error rate" in r for r in summary["validity"]["reasons"])


def test_stall_hits_request_timeout(cells) -> None:
    cfg = tiny_config(sim_args=["--fault-stall-after-tokens", "30", "--fault-stall-s", "6"])
    cfg["workload"]["request_timeout_s"] = 2.0
    summary = cells.run(cfg)
    assert summary["metrics"]["errors"]["by_kind"].get("timeout", 0) >= 1
    assert not summary["validity"]["valid"]


@pytest.mark.parametrize(
    ("flag", "kind"), [("--fault-malformed-after-tokens", "malformed"), ("--fault-truncate-after-tokens", "truncated")]
)
def test_broken_stream_is_an_error_with_its_reason(cells, flag: str, kind: str) -> None:
    summary = cells.run(tiny_config(sim_args=[flag, "20"]))
    df = records(cells)
    bad = df[~df["ok"] & ~aborted(df)]
    assert len(bad) == 1 and bad["error_kind"].iloc[0] == kind and bad["error"].iloc[0]
    assert summary["metrics"]["errors"]["by_kind"] == {kind: 1}
    assert not summary["validity"]["valid"]


def test_server_crash_fails_the_cell_and_writes_nothing(cells) -> None:
    with pytest.raises(ServerError, match="stopped during the cell"):
        cells.run(tiny_config(sim_args=["--fault-crash-after-tokens", "60"]))
    assert not (cells.out_dir("cell") / "summary.json").exists()
    assert not (cells.out_dir("cell") / "requests.parquet").exists()


def test_slow_start_past_timeout_fails_with_command_and_log(cells) -> None:
    with pytest.raises(ServerError) as err:
        cells.run(tiny_config(sim_args=["--fault-slow-start-s", "30"], startup_timeout_s=2))
    text = str(err.value)
    assert "not ready within 2 s" in text
    assert "-m specsweep serve-sim" in text and "--fault-slow-start-s" in text  # the command line
    assert "last 50 lines of the server log" in text and "listening on" in text
    assert not sim_server_processes(cells.root)


def test_exit_during_startup_fails_with_log_tail(cells) -> None:
    with pytest.raises(ServerError) as err:
        cells.run(tiny_config(profile="no-such-profile"))
    text = str(err.value)
    assert "exited during start-up" in text
    assert "no-such-profile" in text  # the server's own complaint, from its log


def test_configured_port_in_use_is_refused_before_launch(cells) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is already in use"):
            cells.run(tiny_config(port=port))
    assert (
        not (cells.state_dir / "servers.log").exists() or " start " not in (cells.state_dir / "servers.log").read_text()
    )


def test_api_key_never_stored(cells, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-specsweep-fault-suite-4242"
    monkeypatch.setenv("SPECSWEEP_TEST_API_KEY", secret)
    summary = cells.run(tiny_config(api_key_env="SPECSWEEP_TEST_API_KEY"), arm="eagle3")
    # the key was sent: the server refuses requests without it (4 ramp requests, then 4 x C measured, fillers)
    m = summary["metrics"]
    assert m["errors"]["count"] == 0 and m["n_measured"] == 16 and m["n_ok"] >= 4 + 16
    assert "***" in summary["server"]["argv"]
    assert secret not in cells.all_text()


def test_missing_api_key_is_a_clear_error(cells, monkeypatch: pytest.MonkeyPatch) -> None:
    from specsweep.redact import MissingAPIKey

    monkeypatch.delenv("SPECSWEEP_TEST_API_KEY", raising=False)
    with pytest.raises(MissingAPIKey, match="SPECSWEEP_TEST_API_KEY"):
        cells.run(tiny_config(api_key_env="SPECSWEEP_TEST_API_KEY"))
