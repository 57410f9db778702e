"""`mmfl run --dp ...`: the per-model differential-privacy wrapper from the
settings, its epsilon per model in summary.json, and its settings refused in one
line when they make no sense."""

from __future__ import annotations

import json
import math

import pytest

from mmfl_flwr import privacy as dp
from mmfl_flwr.cli import main as cli_main
from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.server_app import private
from mmfl_flwr.strategy import MultiModelStrategy

SMALL = [
    "--engine",
    "inprocess",
    "--num-clients",
    "4",
    "--local-epochs",
    "1",
    "--tasks",
    "synthetic,synthetic",
    "--num-rounds",
    "3",
]


def test_dp_run_writes_each_models_epsilon_to_the_summary(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli_main(
        [
            "run",
            *SMALL,
            "--output-dir",
            str(out),
            "--dp",
            "server-fixed",
            "--dp-noise-multiplier",
            "1.5",
            "--dp-clipping-norm",
            "2",
            "--dp-sampled-clients",
            "2",
            "--dp-delta",
            "1e-6",
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["privacy"]) == {"synthetic", "synthetic_2"}
    for p in summary["privacy"].values():
        assert p["delta"] == 1e-6 and p["noise_multiplier"] == 1.5
        assert p["clipping_norm"] == 2.0 and 1 <= p["releases"] <= 3
        # q = 2 of the 4 clients holding the model, one release per round it changed
        assert p["epsilon"] == pytest.approx(dp.epsilon(1.5, [0.5] * p["releases"], 1e-6))
    assert summary["config"]["dp"] == "server-fixed"


def test_the_settings_build_the_named_wrapper():
    base = MultiModelStrategy()
    assert private(base, Settings()) is base
    w = private(
        base,
        Settings(
            dp="client-adaptive",
            dp_sampled_clients=20,
            dp_noise_multiplier=0.5,
            dp_clipping_norm=3.0,
        ),
    )
    assert isinstance(w, dp.DifferentialPrivacyClientSideAdaptiveClipping)
    assert w.initial_clipping_norm == 3.0 and w.num_sampled_clients == 20
    w = private(base, Settings(dp="server-fixed", dp_sampled_clients=4, dp_delta=1e-3))
    assert isinstance(w, dp.DifferentialPrivacyServerSideFixedClipping) and w.delta == 1e-3


@pytest.mark.parametrize(
    "args,words",
    [
        (["--dp", "server-fixed"], "needs dp-sampled-clients >= 1"),
        (["--dp", "server-fixed", "--dp-sampled-clients", "9"], "more than the 4 clients"),
        (["--dp", "server-adaptive", "--dp-sampled-clients", "4"], "needs dp-sampled-clients > 10"),
        (["--dp", "laplace", "--dp-sampled-clients", "2"], "dp"),
        (
            ["--dp", "server-fixed", "--dp-sampled-clients", "2", "--dp-clipping-norm", "0"],
            "dp-clipping-norm",
        ),
        (["--dp", "server-fixed", "--dp-sampled-clients", "2", "--dp-delta", "1"], "dp-delta"),
    ],
)
def test_dp_settings_that_make_no_sense_are_one_line_and_exit_2(args, words, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        cli_main(["run", *SMALL, "--output-dir", str(out), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert len(err.strip().splitlines()) <= 2, err  # argparse's usage line and the reason
    assert words in err and "Traceback" not in err
    assert not out.exists()


def test_no_noise_reports_no_privacy():
    w = dp.DifferentialPrivacyServerSideFixedClipping(MultiModelStrategy(), 0.0, 1.0, 1)
    w.releases["a"] = [1.0]
    assert math.isinf(w.spent("a")["epsilon"])


def test_dp_run_prints_each_models_epsilon_on_the_console(tmp_path, capsys):
    """Issue 62: with --dp the privacy budget was only in summary.json."""
    out = tmp_path / "run"
    args = ["--dp", "server-fixed", "--dp-sampled-clients", "2", "--dp-delta", "1e-6"]
    assert cli_main(["run", *SMALL, "--output-dir", str(out), *args]) == 0
    summary = json.loads((out / "summary.json").read_text())
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "epsilon" in ln]
    assert len(lines) == 1 and lines[0].startswith("[mmfl] privacy"), lines
    assert "delta 1e-06" in lines[0]
    for task, p in summary["privacy"].items():
        assert f"{task} epsilon {p['epsilon']:.3g} ({p['releases']} releases)" in lines[0]
