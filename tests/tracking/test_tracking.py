"""Experiment tracking (issue 59): the trackers' own files, read back with the
trackers' own readers, hold the run's metrics.csv; a failing logger is one
warning; a missing extra is one line and exit 2; the run-config key works as
``flwr run``'s ServerApp reads it.

One small in-process run with all three trackers is shared by the module
(``WANDB_MODE=offline``, MLflow's default store in the output folder).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from mmfl_flwr import runner  # noqa: E402
from mmfl_flwr.config import Settings  # noqa: E402
from mmfl_flwr.tracking import ROUND_COLUMNS, RunLogger  # noqa: E402

SMALL = dict(
    tasks="digits,synthetic",
    num_clients=8,
    num_rounds=3,
    local_epochs=1,
    strategy="lvr",
    budget_fraction=0.6,
    update_clip_factor=1.0,  # clips every update above the median norm: defence events
    seed=5,
)


def csv_cells(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def expected_series(out: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value, from metrics.csv (the non-empty cells)."""
    series: dict[str, dict[int, float]] = {}
    for row in csv_cells(out / "metrics.csv"):
        for col in ROUND_COLUMNS:
            if row.get(col, ""):
                series.setdefault(f"{row['task']}/{col}", {})[int(row["round"])] = float(row[col])
    return series


class Recorder(RunLogger):
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, run):
        self.calls.append(("start", run.start_round, run.params["strategy"]))

    def log_round(self, rnd, metrics, rows):
        self.calls.append(("round", rnd, dict(metrics)))

    def log_clients(self, rnd, counts):
        self.calls.append(("clients", rnd, {c: dict(p) for c, p in counts.items()}))

    def finish(self, status, summary, files):
        self.calls.append(("finish", status, summary, [Path(f).name for f in files]))


class Warnings(logging.Handler):
    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One run with TensorBoard, MLflow, W&B and a recording logger."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    out = tmp_path_factory.mktemp("tracked") / "run"
    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "MLFLOW_TRACKING_URI", "WANDB_DIR")}
    os.environ["WANDB_MODE"] = "offline"
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("WANDB_DIR", None)
    rec = Recorder()
    warn = Warnings(logging.DEBUG)  # each defence action's line: DEBUG, INFO with verbose
    logging.getLogger("flwr").addHandler(warn)
    try:
        runner.run(
            Settings(**SMALL, output_dir=str(out)),
            engine="inprocess",
            loggers=["tensorboard", "mlflow", "wandb", rec],
            verbose=True,
        )
    finally:
        logging.getLogger("flwr").removeHandler(warn)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out, rec, warn.records


def test_tensorboard_scalars_and_steps_equal_metrics_csv(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _, _ = tracked
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = expected_series(out)
    assert expected and set(expected) <= tags
    for tag, by_round in expected.items():
        events = acc.Scalars(tag)
        got = {e.step: e.value for e in events}
        assert sorted(got) == sorted(by_round), tag
        for rnd, value in by_round.items():
            assert got[rnd] == np.float32(value), (tag, rnd)  # TensorBoard keeps float32
    for tag in tags:  # every model tag is a column of metrics.csv or a defence count
        model, _, col = tag.partition("/")
        if model in ("digits", "synthetic") and not col.startswith("defence/"):
            assert tag in expected, tag


def test_mlflow_store_holds_params_metrics_and_artifacts(tracked):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    out, _, _ = tracked
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("mmfl")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    config = json.loads((out / "config.json").read_text())
    params = run.data.params
    for key, value in config.items():
        if key == "effective":
            for k, v in value.items():
                assert json.loads(params[f"effective.{k}"]) == v or params[f"effective.{k}"] == v
        elif isinstance(value, str):
            assert params[key] == value, key
        else:
            assert json.loads(params[key]) == value, key
    assert params["card.paper"] and params["card.title"]
    for tag, by_round in expected_series(out).items():
        history = client.get_metric_history(run.info.run_id, tag)
        assert {m.step: m.value for m in history} == by_round, tag
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "summary.json" in top and "results" in top and "clients" in top
    results = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "results")}
    assert {"metrics.csv", "assignments.csv", "config.json", "report.html"} <= results
    local = client.download_artifacts(run.info.run_id, "results/metrics.csv", str(out.parent))
    assert Path(local).read_bytes() == (out / "metrics.csv").read_bytes()
    summary = json.loads(
        Path(
            client.download_artifacts(run.info.run_id, "summary.json", str(out.parent))
        ).read_text()
    )
    assert summary == json.loads((out / "summary.json").read_text())
    # the clients' training counts: the rounds each client was assigned each model
    counts_csv = client.download_artifacts(
        run.info.run_id, f"clients/client_rounds_round_{SMALL['num_rounds']}.csv", str(out.parent)
    )
    assert _counts_of(Path(counts_csv)) == _counts_from_assignments(out)


def _counts_of(path: Path) -> dict[tuple[str, str], int]:
    rows = csv_cells(path)
    return {
        (r["client"], m): int(v) for r in rows for m, v in r.items() if m != "client" and int(v)
    }


def _counts_from_assignments(out: Path) -> dict[tuple[str, str], int]:
    seen = {(r["round"], r["client"], r["task"]) for r in csv_cells(out / "assignments.csv")}
    counts: dict[tuple[str, str], int] = {}
    for _, cid, task in seen:
        counts[(cid, task)] = counts.get((cid, task), 0) + 1
    return counts


def test_wandb_offline_history_equals_metrics_csv(tracked):
    import wandb_file

    out, _, _ = tracked
    files = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    history = wandb_file.history(files[0])
    by_step: dict[int, dict] = {}
    for row in history:
        by_step.setdefault(int(row["_step"]), {}).update(row)
    for tag, by_round in expected_series(out).items():
        got = {s: row[tag] for s, row in by_step.items() if tag in row}
        assert got == by_round, tag
    config = wandb_file.config(files[0])
    assert config["strategy"] == "lvr" and config["num-clients"] == 8 and config["card.paper"]


def test_recording_logger_sees_every_round_clients_and_the_end(tracked):
    out, rec, _ = tracked
    kinds = [c[0] for c in rec.calls]
    assert kinds[0] == "start" and kinds[-1] == "finish"
    rounds = [c[1] for c in rec.calls if c[0] == "round"]
    assert rounds == list(range(SMALL["num_rounds"] + 1))
    status, summary, files = rec.calls[-1][1:]
    assert status == "finished"
    assert summary == json.loads((out / "summary.json").read_text())
    assert {"metrics.csv", "summary.json", "report.html"} <= set(files)
    (clients,) = [c for c in rec.calls if c[0] == "clients"]
    got = {(cid, m): n for cid, per in clients[2].items() for m, n in per.items()}
    assert got == _counts_from_assignments(out)
    # the round's metrics: metrics.csv's cells, seconds and the mean accuracy
    cells = csv_cells(out / "metrics.csv")
    for _, rnd, metrics in (c for c in rec.calls if c[0] == "round"):
        rows = [r for r in cells if int(r["round"]) == rnd]
        accs = [float(r["accuracy"]) for r in rows]
        assert metrics["round/mean_accuracy"] == pytest.approx(sum(accs) / len(accs), rel=1e-12)
        assert ("round/seconds" in metrics) == (rnd > 0)


def test_defence_actions_are_counted_by_kind_as_the_checks_log_them(tracked):
    out, rec, records = tracked
    clipped: dict[str, int] = {}
    for r in records:
        if str(r.msg).startswith("Client %s: clipped update for task %r: update norm"):
            assert r.levelno == logging.INFO  # DEBUG; INFO with verbose, never WARNING
            clipped[r.args[1]] = clipped.get(r.args[1], 0) + 1
    assert clipped, "the run should clip updates (update_clip_factor=1)"
    rows = csv_cells(out / "events.csv")
    from_csv: dict[str, int] = {}
    for r in rows:
        if r["kind"] == "clipped":
            from_csv[r["task"]] = from_csv.get(r["task"], 0) + 1
    assert from_csv == clipped
    logged: dict[str, float] = {}
    for _, _, metrics in (c for c in rec.calls if c[0] == "round"):
        for key, value in metrics.items():
            if key.endswith("/defence/clipped"):
                logged[key.split("/")[0]] = logged.get(key.split("/")[0], 0) + value
    assert logged == clipped
    summary = json.loads((out / "summary.json").read_text())["defence_events"]
    assert summary["by_kind"]["clipped"]["count"] == sum(clipped.values())


def test_tracker_counts_are_the_events_by_model_and_kind():
    from mmfl_flwr.strategy.events import DefenceEvent, by_task_kind

    def ev(rnd, cid, task, kind):
        return DefenceEvent(rnd, cid, task, kind, 2.0, 1.0, "r")

    events = [
        ev(1, "3", "digits", "rejected"),
        ev(1, "4", "synthetic", "direction"),
        ev(1, "5", "digits", "missing"),
        ev(1, "5", "synthetic", "missing"),
    ]
    assert by_task_kind(events) == {
        "digits": {"rejected": 1, "missing": 1},
        "synthetic": {"direction": 1, "missing": 1},
    }
    assert by_task_kind([]) == {}


class Boom(RunLogger):
    name = "boom"

    def log_round(self, rnd, metrics, rows):
        raise RuntimeError("tracker unreachable")


def test_a_failing_logger_is_one_warning_and_the_run_goes_on(tmp_path):
    warn = Warnings()
    flwr = logging.getLogger("flwr")
    flwr.addHandler(warn)
    rec = Recorder()
    try:
        runner.run(
            Settings(**{**SMALL, "num_rounds": 2}, output_dir=str(tmp_path / "run")),
            engine="inprocess",
            loggers=[Boom(), rec],
        )
    finally:
        flwr.removeHandler(warn)
    failed = [r for r in warn.records if "Logger %s failed" in str(r.msg)]
    assert len(failed) == 1 and failed[0].args[0] == "boom"
    assert [c[1] for c in rec.calls if c[0] == "round"] == [0, 1, 2]
    assert rec.calls[-1][1] == "finished"
    rounds = {int(r["round"]) for r in csv_cells(tmp_path / "run" / "metrics.csv")}
    assert rounds == {0, 1, 2}


class StopAt(RunLogger):
    """Ctrl-C after round ``at`` (raised from the round callback, as a signal would)."""

    name = "stop"

    def __init__(self, at: int) -> None:
        self.at = at
        self.status = None

    def log_round(self, rnd, metrics, rows):
        if rnd == self.at:
            raise KeyboardInterrupt

    def finish(self, status, summary, files):
        self.status = status


def test_an_interrupted_run_gets_a_report_of_its_finished_rounds(tmp_path):
    from html_report import parse

    out = tmp_path / "run"
    stop, rec = StopAt(2), Recorder()
    with pytest.raises(KeyboardInterrupt):
        runner.run(
            Settings(**{**SMALL, "num_rounds": 4}, output_dir=str(out)),
            engine="inprocess",
            loggers=[stop, rec],
        )
    assert stop.status == "interrupted" and rec.calls[-1][1] == "interrupted"
    page = parse((out / "report.html").read_text())
    cells = csv_cells(out / "metrics.csv")
    assert {int(r["round"]) for r in cells} == {0, 1, 2}
    assert page.table("metrics") == [[r[c] for c in cells[0]] for r in cells]
    assert "interrupted or not finished: rounds 0 to 2 of 4" in page.text("summary")
    assert not (out / "summary.json").exists()


def test_missing_extra_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys):
    from mmfl_flwr import cli

    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        cli.main(
            ["run", "--engine", "inprocess", "--num-clients", "4", "--num-rounds", "1",
             "--output-dir", str(out), "--log-to", "tensorboard,mlflow"]
        )  # fmt: skip
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'mmfl-flwr[mlflow]'" in err[0], err
    assert not out.exists()
    with pytest.raises(ValueError, match=r"pip install 'mmfl-flwr\[mlflow\]'"):
        runner.run(Settings(**SMALL, output_dir=str(out)), engine="inprocess", loggers=["mlflow"])
    assert not out.exists()


@pytest.mark.parametrize("value", ["nope", "tensorboard,nope"])
def test_unknown_tracker_is_one_line_exit_2(tmp_path, capsys, value):
    from mmfl_flwr import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(
            ["run", "--engine", "inprocess", "--output-dir", str(tmp_path / "r"), "--log-to", value]
        )
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown tracker 'nope'" in err[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--log-dir", "tb"], "needs --log-to tensorboard"),
        (["--log-to", "mlflow", "--log-dir", "tb"], "needs --log-to tensorboard"),
        (["--log-clients-every", "2"], "none is named"),
    ],
)
def test_tracking_flags_without_their_tracker_are_refused(tmp_path, capsys, flags, words):
    from mmfl_flwr import cli

    out = tmp_path / "r"
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "--engine", "inprocess", "--output-dir", str(out), *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not out.exists()


def test_logger_objects_are_refused_on_the_simulation_engine():
    with pytest.raises(ValueError, match="another one"):
        runner.run(Settings(**SMALL, output_dir=""), engine="simulation", loggers=[Recorder()])


def test_the_run_config_key_log_to_reaches_the_serverapp(tmp_path):
    """The ServerApp under ``flwr run`` reads its settings from the run config:
    ``log-to`` there starts the tracker (here on an in-process grid)."""
    pytest.importorskip("tensorboard")
    from flwr.app import Context, RecordDict

    from mmfl_flwr.flower_app.client_app import build_client_app
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.flower_app.server_app import server_main
    from mmfl_flwr.grid import InProcessGrid

    s = Settings(**{**SMALL, "num_rounds": 1}, output_dir=str(tmp_path / "run"))
    cfg = {**s.to_run_config(), "log-to": "tensorboard", "log-dir": str(tmp_path / "tb")}
    federation_for(s)
    grid = InProcessGrid(build_client_app(s), runner.node_configs(s), cfg, seed=s.seed)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg)
    server_main(grid, ctx)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("digits/accuracy")] == [0, 1]
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_progress_bar_on_a_terminal_lines_elsewhere(monkeypatch, capsys):
    import io

    from mmfl_flwr.tracking import progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    rows = [
        {"task": "a", "accuracy": 0.5, "uploads": 2},
        {"task": "b", "accuracy": 0.7, "uploads": 1},
    ]
    tty = Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    show, close = progress.make_progress(3)
    assert isinstance(show, progress.ProgressBar)
    show(1, rows)
    close()
    assert "mean acc 0.600" in tty.getvalue() and "1/3" in tty.getvalue()
    show, close = progress.make_progress(3, no_progress=True)  # --no-progress
    show(1, rows)
    close()
    assert "[mmfl] round   1/3 | acc a=0.500 b=0.700 | uploads 3" in tty.getvalue()
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a terminal
    show, _ = progress.make_progress(3)
    assert not isinstance(show, progress.ProgressBar)


def test_the_vectorized_engine_logs_the_same_metrics(tmp_path):
    """The loggers run in the ServerApp, so every engine logs alike: here the
    vectorized engine's TensorBoard events hold its metrics.csv."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    rec = Recorder()
    runner.run(
        Settings(**{**SMALL, "num_rounds": 2}, output_dir=str(out)),
        engine="vectorized",
        loggers=["tensorboard", rec],
    )
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    expected = expected_series(out)
    assert expected
    for tag, by_round in expected.items():
        assert {e.step: e.value for e in acc.Scalars(tag)} == {
            r: np.float32(v) for r, v in by_round.items()
        }, tag
    assert [c[1] for c in rec.calls if c[0] == "round"] == [0, 1, 2]
    assert json.loads((out / "summary.json").read_text())["engine"] == "vectorized"


def _on_a_terminal(args: list[str]) -> str:
    """What ``mmfl run ARGS`` prints on a pseudo-terminal."""
    import pty
    import subprocess

    main, sub = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmfl_flwr.cli", "run", *args],
        stdin=sub,
        stdout=sub,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "120", "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    os.close(sub)
    out = b""
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:
            break
        if not data:
            break
        out += data
    assert proc.wait(timeout=300) == 0
    os.close(main)
    return out.decode(errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals")
def test_mmfl_run_draws_a_bar_on_a_terminal_and_lines_with_no_progress(tmp_path):
    args = ["--engine", "inprocess", "--tasks", "digits", "--num-clients", "4",
            "--num-rounds", "2", "--local-epochs", "1"]  # fmt: skip
    bar = _on_a_terminal([*args, "--output-dir", str(tmp_path / "a")])
    assert "[mmfl] round" in bar and "2/2" in bar and "mean acc" in bar and "━" in bar
    assert "[mmfl] round   1/2 |" not in bar
    lines = _on_a_terminal([*args, "--output-dir", str(tmp_path / "b"), "--no-progress"])
    assert "[mmfl] round   1/2 | acc digits=" in lines and "━" not in lines


def test_an_unreachable_mlflow_server_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(key, "0")  # so that undo also removes what the logger sets
        monkeypatch.delenv(key)
    warn = Warnings()
    flwr = logging.getLogger("flwr")
    flwr.addHandler(warn)
    rec = Recorder()
    try:
        runner.run(
            Settings(**{**SMALL, "num_rounds": 1}, output_dir=str(tmp_path / "run")),
            engine="inprocess",
            loggers=["mlflow", rec],
        )
    finally:
        flwr.removeHandler(warn)
    failed = [r for r in warn.records if "Logger %s failed" in str(r.msg)]
    assert [(r.args[0], r.args[1]) for r in failed] == [("mlflow", "start")]
    assert rec.calls[-1][1] == "finished"
    assert (tmp_path / "run" / "summary.json").is_file()


def test_client_counts_every_k_rounds_and_at_the_end():
    from mmfl_flwr.tracking import LoggerHub, RunInfo

    assignments = {
        1: [("0", "a", 1), ("1", "b", 2)],
        2: [("0", "a", 1), ("0", "b", 1)],
        3: [("1", "b", 1), ("1", "b", 1)],  # one client picked twice for a model: one round
    }
    rec = Recorder()
    hub = LoggerHub([rec], clients_every=2)
    hub.start(RunInfo(name="x", params={"strategy": "s"}, models=["a", "b"], num_rounds=3))
    for rnd in range(4):
        rows = [{"round": rnd, "task": t, "accuracy": 0.5, "uploads": 1} for t in ("a", "b")]
        hub.round(rnd, rows, {r: p for r, p in assignments.items() if r <= rnd})
    hub.finish("finished", 3, assignments, None, [])
    clients = [(c[1], c[2]) for c in rec.calls if c[0] == "clients"]
    assert clients == [
        (2, {"0": {"a": 2, "b": 1}, "1": {"b": 1}}),
        (3, {"0": {"a": 2, "b": 1}, "1": {"b": 2}}),
    ]
    assert rec.calls[-1][:2] == ("finish", "finished")


def test_the_documented_custom_logger_example_runs(tmp_path, monkeypatch):
    """docs/tracking.md's example of a RunLogger, run as written (in a temporary
    working folder): its CSV holds the mean accuracy of every round."""
    pytest.importorskip("tensorboard")
    doc = (Path(__file__).parents[2] / "docs" / "tracking.md").read_text()
    section = doc[doc.index("## Your own logger") :]
    code = section[
        section.index("```python\n") + 10 : section.index("```", section.index("```python\n") + 10)
    ]
    code = code.replace("num_rounds=5", "num_rounds=2").replace("num_clients=10", "num_clients=6")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/tracking.md", "exec"), {"__name__": "docs_example"})
    out = tmp_path / "results" / "own-logger"
    means = {
        int(r["round"]): float(r["mean_accuracy"]) for r in csv_cells(out / "mean_accuracy.csv")
    }
    rows = csv_cells(out / "metrics.csv")
    for rnd in range(3):
        accs = [float(r["accuracy"]) for r in rows if int(r["round"]) == rnd]
        assert means[rnd] == sum(accs) / len(accs)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_overwrite_starts_the_default_tensorboard_folder_afresh(tmp_path):
    """A new run in a folder (--overwrite) replaces the older run's TensorBoard
    events, as it replaces its metrics.csv: no step holds two runs' values."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    for seed in (1, 2):
        s = Settings(**{**SMALL, "num_rounds": 1, "seed": seed}, output_dir=str(out))
        s.overwrite = True
        runner.run(s, engine="inprocess", loggers=["tensorboard"])
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    for tag, by_round in expected_series(out).items():
        events = acc.Scalars(tag)
        assert [e.step for e in events] == sorted(by_round), tag
        assert [e.value for e in events] == [np.float32(by_round[r]) for r in sorted(by_round)]


@pytest.mark.parametrize(
    "env, mode",
    [
        ({}, "offline"),  # no account configured: never a login prompt
        ({"WANDB_API_KEY": "x" * 40}, "online"),
        ({"WANDB_API_KEY": "x" * 40, "WANDB_MODE": "offline"}, "offline"),
        ({"WANDB_MODE": "disabled"}, "disabled"),
    ],
)
def test_wandb_mode_follows_wandb_mode_then_the_api_key(monkeypatch, env, mode):
    from mmfl_flwr.tracking.wandb import wandb_mode

    for key in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert wandb_mode() == mode
