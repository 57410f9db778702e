"""Engine options are checked once (EngineOptions): mmfl run's flags and runner.run's
keywords refuse the same values by the same rule, each in its own words."""

from __future__ import annotations

import numpy as np
import pytest

from mmfl_flwr.cli import main
from mmfl_flwr.config import Settings
from mmfl_flwr.engine_options import EngineOptions, check_chunk
from mmfl_flwr.runner import run

#: (option, value, engine it is given to, what the refusal says)
WRONG = [
    ("vector_chunk", 4, "inprocess", "applies to"),
    ("vector_chunk", 0, "vectorized", "must be >= 1"),
    ("threads", 2, "simulation", "applies to"),
    ("threads", "many", "vectorized", "auto or a whole number"),
    ("num_gpus_per_client", 0.5, "inprocess", "applies to"),
    ("num_gpus_per_node", 1.0, "vectorized", "applies to"),
    ("ray_address", "127.0.0.1:6379", "inprocess", "applies to"),
]


@pytest.mark.parametrize(("option", "value", "engine", "says"), WRONG)
def test_python_and_cli_refuse_alike(option, value, engine, says, tmp_path, capsys):
    with pytest.raises(ValueError, match=says) as python:
        run(Settings(output_dir=str(tmp_path / "py")), engine=engine, **{option: value})
    assert option in str(python.value)
    flag = f"--{option.replace('_', '-')}"
    with pytest.raises(SystemExit) as cli:
        main(["run", "--engine", engine, flag, str(value), "--output-dir", str(tmp_path / "c")])
    assert cli.value.code == 2
    err = capsys.readouterr().err
    assert says in err and flag in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "py").exists() and not (tmp_path / "c").exists()


def test_accepted_options_and_their_ray_keywords():
    EngineOptions("vectorized", vector_chunk=8, threads="auto").check()
    EngineOptions("vectorized", vector_chunk=np.int64(8), threads=3).check()
    opts = EngineOptions("simulation", num_gpus_per_client=0.25, ray_address="auto")
    opts.check(flags=True)
    assert opts.ray_options() == {"num_gpus_per_client": 0.25, "ray_address": "auto"}
    with pytest.raises(ValueError, match="unknown engine 'ray'"):
        EngineOptions("ray").check()


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True, "4"])
def test_a_chunk_is_a_whole_number_of_clients(chunk):
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        check_chunk(chunk)
    assert check_chunk(None) is None and check_chunk(5) == 5
