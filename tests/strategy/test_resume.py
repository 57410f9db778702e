"""Kill-and-resume on the in-process engine.

A run is "killed" after round 2 of 4 by a progress callback that raises (the
checkpoint of a round is written before the callback), then resumed from its
output folder (``Settings.load(config.json)`` + ``resume_from``). Its
``metrics.csv`` and ``assignments.csv`` must be byte-identical to those of an
uninterrupted run, for stateful policies and aggregators alike. Also: atomic
checkpoint replacement, a stray ``checkpoint.pkl.tmp``, a mismatched strategy,
and ``mmfl run --resume``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from mmfl_flwr import checkpoint as ckpt
from mmfl_flwr.checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint
from mmfl_flwr.cli import main as cli_main
from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app import server_app
from mmfl_flwr.presets import presets_taking
from mmfl_flwr.runner import run

BASE = dict(num_clients=6, num_rounds=4, profile="paper003", local_epochs=1, budget_fraction=0.5)


def settings(strategy: str, out: Path, **kw) -> Settings:
    """BASE settings for ``strategy`` (budget-fraction only where it is used)."""
    base = {
        k: v for k, v in BASE.items() if k != "budget_fraction" or strategy in presets_taking(k)
    }
    return Settings(strategy=strategy, output_dir=str(out), **{**base, **kw})


class Killed(RuntimeError):
    """Stands in for the process dying right after a round's checkpoint."""


def kill_after(monkeypatch, at: int = 2) -> list[int]:
    seen: list[int] = []

    def printer(num_rounds, defence=None):
        def cb(rnd, rows):
            seen.append(rnd)
            if rnd == at:
                raise Killed(f"killed after round {rnd}")

        return cb

    monkeypatch.setattr(server_app, "progress_printer", printer)
    return seen


def record_rounds(monkeypatch) -> list[int]:
    seen: list[int] = []
    monkeypatch.setattr(
        server_app, "progress_printer", lambda n, defence=None: lambda rnd, rows: seen.append(rnd)
    )
    return seen


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs, one per (strategy, settings), computed once."""
    cache: dict = {}

    def get(strategy: str, **kw) -> Path:
        key = (strategy, tuple(sorted(kw.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp("ref-" + strategy)
            run(settings(strategy, out, **kw), engine="inprocess")
            cache[key] = out
        return cache[key]

    return get


def _kill(strategy, out, monkeypatch, **kw):
    seen = kill_after(monkeypatch)
    with pytest.raises(Killed):
        run(settings(strategy, out, **kw), engine="inprocess")
    assert seen == [0, 1, 2]
    # the run really died before the end: no summary, the tables hold rounds 0-2
    assert not (out / "summary.json").exists()
    from mmfl_flwr.results import read_metrics_csv

    assert sorted({int(r["round"]) for r in read_metrics_csv(out / "metrics.csv")}) == [0, 1, 2]
    state = load_checkpoint(out)
    assert state["round"] == 2 and sorted(state["assignments"]) == [1, 2]
    assert not (out / (CHECKPOINT_FILE + ".tmp")).exists()
    return state


def _same_arrays(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same_arrays(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same_arrays(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b or (a != a and b != b)


CASES = [
    ("stalevre", {}),
    ("stalevr", {}),
    ("lvr", {}),
    ("mfa-rr", {}),
    ("fedvarp", {}),
    ("stalevre", {"stale_storage": "float16"}),
]


@pytest.mark.parametrize(
    "strategy, kw", CASES, ids=[s + "".join(f"-{v}" for v in kw.values()) for s, kw in CASES]
)
def test_kill_and_resume_gives_identical_outputs(strategy, kw, reference, tmp_path, monkeypatch):
    ref = reference(strategy, **kw)
    out = tmp_path / "run"
    state = _kill(strategy, out, monkeypatch, **kw)
    if kw.get("stale_storage") == "float16":
        entries = state["aggregator"]["store"]["entries"]
        assert entries and all(a.dtype == np.float16 for e in entries for a in e["arrays"])
    # a crash in the middle of a later checkpoint write leaves a truncated .tmp behind;
    # it must not be read
    (out / (CHECKPOINT_FILE + ".tmp")).write_bytes(b"\x80\x05\x95garbage, truncated")

    resumed_rounds = record_rounds(monkeypatch)
    s = Settings.load(str(out / "config.json"))
    s.resume_from = str(out)
    result = run(s, engine="inprocess")
    assert resumed_rounds == [3, 4]  # continued, not restarted
    assert [r["round"] for r in result.history] == [r for r in range(5) for _ in range(3)]

    for name in ("metrics.csv", "assignments.csv"):
        assert (out / name).read_text() == (ref / name).read_text(), name
    assert not (out / (CHECKPOINT_FILE + ".tmp")).exists()
    # the full final state matches the uninterrupted run's, bit for bit
    a, b = load_checkpoint(out), load_checkpoint(ref)
    assert a["round"] == b["round"] == 4
    for key in ("weights", "policy", "aggregator", "rng", "eval_rng", "assignments"):
        _same_arrays(a[key], b[key])


def test_reference_run_leaves_no_tmp_and_checkpoint_is_complete(reference):
    ref = reference("fedvarp")
    assert sorted(p.name for p in ref.iterdir() if "checkpoint" in p.name) == [CHECKPOINT_FILE]
    state = load_checkpoint(ref)
    assert state["round"] == 4
    assert state["policy_name"] == "RandomAllocation"
    assert state["aggregator_name"] == "FedVARPAggregator"
    assert len(state["aggregator"]["store"]["entries"]) > 0


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "out"
    first = {"round": 1, "payload": np.arange(5.0)}
    target = save_checkpoint(path, first)
    assert target == path / CHECKPOINT_FILE
    assert [p.name for p in path.iterdir()] == [CHECKPOINT_FILE]

    def dying_dump(obj, f, protocol=None):
        f.write(b"\x80\x05partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.pickle, "dump", dying_dump)
    with pytest.raises(OSError):
        save_checkpoint(path, {"round": 2, "payload": np.zeros(5)})
    monkeypatch.undo()
    state = load_checkpoint(path)  # the previous checkpoint is intact
    assert state["round"] == 1
    np.testing.assert_array_equal(state["payload"], np.arange(5.0))
    # the next successful write replaces both files' roles cleanly
    save_checkpoint(path, {"round": 3})
    assert load_checkpoint(path)["round"] == 3
    assert [p.name for p in path.iterdir()] == [CHECKPOINT_FILE]
    # an explicit .pkl file path is used as is
    f = tmp_path / "x.pkl"
    assert save_checkpoint(f, {"round": 7}) == f and load_checkpoint(f)["round"] == 7


def test_load_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path)
    with open(tmp_path / CHECKPOINT_FILE, "wb") as f:
        pickle.dump({"format": 999, "round": 1}, f)
    with pytest.raises(ValueError, match="format"):
        load_checkpoint(tmp_path)


def test_resume_with_a_different_strategy_raises(reference, tmp_path):
    src = reference("stalevre")
    # copy the checkpoint so the shared reference folder is not touched
    out = tmp_path / "run"
    out.mkdir()
    (out / CHECKPOINT_FILE).write_bytes((src / CHECKPOINT_FILE).read_bytes())
    for other in ("lvr", "fedvarp"):  # same policy / a different policy and aggregator
        with pytest.raises(ValueError, match="resume with the same strategy"):
            run(
                settings(other, tmp_path / f"o-{other}", resume_from=str(out), num_rounds=5),
                engine="inprocess",
            )


def test_rejected_resume_leaves_the_run_folder_resumable(reference, tmp_path, monkeypatch):
    src = reference("stalevre")
    out = tmp_path / "run"
    out.mkdir()
    for name in (CHECKPOINT_FILE, "config.json"):
        (out / name).write_bytes((src / name).read_bytes())
    with pytest.raises(ValueError):
        run(settings("lvr", out, resume_from=str(out), num_rounds=5), engine="inprocess")
    assert json.loads((out / "config.json").read_text())["strategy"] == "stalevre"


def test_cli_resume(reference, tmp_path, monkeypatch, capsys):
    ref = reference("mfa-rr")
    out = tmp_path / "run"
    _kill("mfa-rr", out, monkeypatch)
    record_rounds(monkeypatch)
    assert cli_main(["run", "--resume", str(out), "--engine", "inprocess"]) == 0
    for name in ("metrics.csv", "assignments.csv"):
        assert (out / name).read_text() == (ref / name).read_text(), name
    assert "mfa-rr" in capsys.readouterr().out


def test_cli_resume_missing_folder_is_a_clear_usage_error(tmp_path, capsys):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(SystemExit) as exc:
        cli_main(["run", "--resume", str(missing), "--engine", "inprocess"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "config.json" in err and str(missing) in err
