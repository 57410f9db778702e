"""Shared plumbing of the paper-evidence scripts (issue: the papers' evidence).

Every experiment script under ``benchmarks/`` that feeds RESULTS.md uses this module:

* :class:`Parser` refuses a flag in one line (exit code 2); :func:`mode_args` adds
  ``--quick`` (the default: minutes on 2 cores) / ``--full``, ``--engine`` (default
  ``vectorized``, the fastest engine), ``--workers`` and ``--out`` (default
  ``docs/results``) to an argparse parser;
* :func:`run_many` runs ``Settings`` keyword dicts (one per (method, seed)) on an engine in
  worker processes and returns their history rows tagged with the method and seed;
* :func:`write_long_csv` writes those rows as one long CSV (``method, seed, round, task,
  accuracy, loss, ...``), the raw data of a figure;
* :func:`paired_ci` / :func:`compare_to_reference` give paired per-seed differences
  against a reference method with a 95% t confidence interval and a verdict (``better``,
  ``worse`` or ``level`` where the interval covers 0);
* :func:`plot_curves` (mean curve per method with a shaded 95% band over seeds) and
  :func:`plot_final` (box plot of a final value per method) write PNGs;
* :func:`write_fragment` writes the experiment's Markdown fragment
  (``<out>/<name>.md``) that ``benchmarks/reproduce.py`` assembles into RESULTS.md;
* :func:`run_jobs`, :func:`mean_sd` and :func:`write_outputs` serve the comparison
  scripts (``compare_strategies.py``, ``group_compare.py``, ``ucb_compare.py``,
  ``fig5_staleness.py``, ``hostile_clients.py``): a function over jobs in worker
  processes, mean ± sd, and their ``--json`` / ``--markdown`` files.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import sys
import time
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "results"

#: Paper 003's federation on the digits stand-in, as the investigations of its stale
#: and unbiased aggregation run it (``coef_sum_mean.py``, ``mifa_seen_share.py``): 120
#: clients of the ``paper003`` profile, a budget of 10% of the clients, batches of 16,
#: one local epoch, nothing written. Each script adds its strategy, rounds, rate, seed.
PAPER003_FEDERATION: dict[str, Any] = dict(
    tasks="digits,digits,digits",
    profile="paper003",
    num_clients=120,
    local_epochs=1,
    batch_size=16,
    budget_fraction=0.1,
    output_dir="",
)


# ------------------------------------------------------------------------ arguments


class Parser(argparse.ArgumentParser):
    """The scripts' argument parser: a refused flag or value is one line on stderr
    (``<script>: error: <why> (see <script> --help)``, no usage block) and exit code 2,
    as ``mmfl`` refuses them."""

    def error(self, message: str) -> typing.NoReturn:
        print(
            f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)


def mode_args(
    parser: argparse.ArgumentParser,
    engine: str | None = "vectorized",
    engine_why: str = "the fastest",
    workers_help: str = "default 1: the vectorized engine already uses every core",
) -> argparse.ArgumentParser:
    """Add ``--quick`` / ``--full`` / ``--smoke``, ``--engine``, ``--workers``, ``--out``,
    ``--cache`` and ``--from-csv``. ``engine`` is the default engine (None: the caller
    leaves it to each script); ``engine_why`` and ``workers_help`` go into ``--help``,
    which must state the defaults the script really uses."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--quick",
        dest="mode",
        action="store_const",
        const="quick",
        help="small scale, minutes on 2 cores (default)",
    )
    group.add_argument(
        "--full",
        dest="mode",
        action="store_const",
        const="full",
        help="the scale reported in RESULTS.md",
    )
    group.add_argument(
        "--smoke",
        dest="mode",
        action="store_const",
        const="smoke",
        help="the smallest scale that runs every step (seconds; what the "
        "test suite runs: its numbers mean nothing)",
    )
    parser.set_defaults(mode="quick")
    shown = engine or "each script's own"
    parser.add_argument(
        "--engine",
        default=engine,
        choices=("vectorized", "inprocess", "simulation"),
        help=f"engine of every run (default: {shown}" + (f", {engine_why})" if engine_why else ")"),
    )
    parser.add_argument(
        "--workers", type=int, default=1, help=f"runs in parallel (processes; {workers_help})"
    )
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="folder of the CSV, PNG and Markdown outputs"
    )
    parser.add_argument(
        "--cache",
        default="",
        help="JSON-lines file of finished runs: appended as runs finish, "
        "and runs already there are not run again (resume a stopped "
        "--full run)",
    )
    parser.add_argument(
        "--from-csv",
        default="",
        metavar="CSV",
        help="run nothing: re-analyse the runs of this configuration from "
        "the long CSV a previous invocation wrote (refused if it lacks "
        "one of them); the section keeps the machine that ran them",
    )
    return parser


#: The largest value an integer list takes: a seed reaches numpy's and scikit-learn's
#: random states, which take 32-bit seeds
INT_LIST_MAX = 2**32 - 1


def int_list(parser: argparse.ArgumentParser, name: str, text: str, low: int = 0) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``, with ranges: ``"0-3,7"`` -> ``[0, 1, 2, 3, 7]``;
    anything else (and a value above :data:`INT_LIST_MAX`) is refused through
    ``parser.error`` (one line, exit code 2, before anything is written)."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        parser.error(f"{name}: give at least one value; got {text!r}")
    values: list[int] = []
    try:
        for x in items:
            first, dash, last = x.partition("-")
            part = list(range(int(first), int(last) + 1)) if first and dash else [int(x)]
            if not part:
                parser.error(f"{name}: the range gives no value (write 2-5, not 5-2); got {text!r}")
            values += part
    except ValueError:
        parser.error(f"{name}: expected integers or ranges (0-7) separated by commas; got {text!r}")
    if any(v < low for v in values):
        parser.error(f"{name}: every value must be >= {low}; got {text!r}")
    if any(v > INT_LIST_MAX for v in values):
        parser.error(f"{name}: every value must be <= {INT_LIST_MAX}; got {text!r}")
    if len(set(values)) < len(values):
        parser.error(f"{name}: give each value once; got {text!r}")
    return values


def check_settings(parser: argparse.ArgumentParser, settings: Iterable[Mapping[str, Any]]) -> None:
    """Refuse (``parser.error``: one line, exit code 2, before anything runs or is
    written) run settings that :class:`mmfl_flwr.config.Settings` refuses (a learning
    rate that is not a finite positive number, a budget outside [0, 1], an unknown
    task, ...): each distinct ``settings`` mapping (keywords of ``Settings``) is built
    once, as the runs would build it."""
    from mmfl_flwr.config import Settings

    seen: set[str] = set()
    for kw in settings:
        key = repr(sorted(kw.items()))
        if key in seen:
            continue
        seen.add(key)
        try:
            Settings(**{"output_dir": "", **kw}).validate()
        except (TypeError, ValueError) as err:
            parser.error(str(err).splitlines()[0] if str(err) else repr(err))


def at_least_one(parser: argparse.ArgumentParser, args: argparse.Namespace, *dests: str) -> None:
    """Refuse (``parser.error``: one line, exit code 2) any of the integer options
    ``dests`` (argparse dest names, e.g. ``num_rounds``) given below 1."""
    for dest in dests:
        value = getattr(args, dest)
        if value < 1:
            parser.error(f"--{dest.replace('_', '-')} must be >= 1; got {value}")


def name_list(
    parser: argparse.ArgumentParser,
    name: str,
    text: str,
    known: Iterable[str] | Callable[[str], bool],
    shown: str = "",
) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``; an empty list, a name that is not ``known`` (a
    collection, or a test of one name) or a name given twice is refused through
    ``parser.error`` (one line, exit code 2, before anything is written): an empty
    list would run nothing and still write (and judge) a section. ``shown``: the
    choices as the message states them (default: the collection)."""
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    if not names:
        parser.error(f"{name}: give at least one name; got {text!r}")
    test = known if callable(known) else set(known).__contains__
    unknown = [x for x in names if not test(x)]
    if unknown:
        choices = shown or ", ".join(known)  # type: ignore[arg-type]
        parser.error(f"{name}: unknown {unknown}; choose from {choices}")
    if len(set(names)) < len(names):
        parser.error(f"{name}: give each name once; got {text!r}")
    return names


def margin_arg(parser: argparse.ArgumentParser, text: str) -> float:
    """An equivalence margin in (0, 1) (accuracy), or refused through
    ``parser.error`` (one line, exit code 2, before anything is written)."""
    try:
        margin = float(text)
    except ValueError:
        margin = math.nan
    if not 0 < margin < 1:
        parser.error(f"--margin: expected a number in (0, 1); got {text!r}")
    return margin


def command(script: str, argv: Sequence[str] | None) -> str:
    """The command line that reproduces a script's results: its arguments without
    ``--cache``, ``--workers`` and ``--from-csv`` (which change how fast, not what),
    and without ``--out`` unless it names a folder under docs/results (the section's
    own place, e.g. docs/results/mnist5k/tasks_9seeds, which running the command
    without it would overwrite docs/results' sections)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for k, arg in enumerate(args):
        if skip:
            skip = False
            continue
        name, eq, value = arg.partition("=")
        if name in ("--cache", "--out", "--workers", "--from-csv"):
            skip = not eq
            if not eq and k + 1 < len(args):
                value = args[k + 1]
            published = _published_folder(value) if name == "--out" else None
            if published:
                kept += ["--out", published]
            continue
        kept.append(arg)
    return " ".join([f"python benchmarks/{script}.py"] + kept)


def check_output_files(parser: argparse.ArgumentParser, named: Iterable[tuple[str, str]]) -> None:
    """Refuse, in one line, an output file option (``(flag, path)``; an empty path is
    unset) that names a folder or whose folder does not exist: before any run."""
    for name, path in named:
        if path and os.path.isdir(path):
            parser.error(f"{name} {path}: a folder; give a file name")
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"{name} {path}: its folder does not exist")


def _published_folder(path: str) -> str | None:
    """``docs/results/<sub>`` when ``path`` is a folder under the published results
    other than docs/results itself (it names which section a command makes: kept in
    the command shown), else None."""
    p = Path(path)
    if not p.is_absolute() and p.parts[:2] == ("docs", "results"):
        p = REPO / p  # as written from the repository's root
    try:
        rel = p.resolve().relative_to(DEFAULT_OUT.resolve())
    except (ValueError, OSError):
        return None
    return f"docs/results/{rel.as_posix()}" if rel.parts else None


def figure_folder(out: str | Path) -> str:
    """Where a fragment written to ``out`` links its figures: ``docs/results/<sub>``
    when ``out`` is a published subfolder (an investigation's own section), else
    ``docs/results`` (a section's figures, wherever this invocation wrote them: RESULTS.md
    links the published ones)."""
    return _published_folder(str(out)) or "docs/results"


def machine() -> str:
    """One line naming the machine (CPU model and the vector kernels torch runs on
    it, cores, torch, GPU if any). The kernels are named because the model name
    alone does not fix float32 rounding: the same code and seed on two machines
    named "AMD EPYC, 2 cores" trained differently from round 1, and a chaotic run
    (label-clustered CNN training) then ends elsewhere (docs/results/investigations.md,
    mnist-5k; which library or kernel difference caused it was not determined)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        tv = torch.__version__
        try:
            kernels = f" ({torch.backends.cpu.get_cpu_capability()} kernels)"
        except AttributeError:  # pragma: no cover - a torch without it
            kernels = ""
    except ImportError:  # pragma: no cover
        gpu, tv, kernels = "no GPU", "none", ""
    return f"{cpu}{kernels}, {os.cpu_count()} cores, {gpu}, torch {tv}"


# ------------------------------------------------------------- reproduction mode
#: The values of ``--defences``: ``off`` (the default) runs the papers' algorithms as the
#: papers state them, every bound of :data:`mmfl_flwr.config.BOUNDS` off (the run-config
#: switch ``defences = "off"``); ``default`` runs the project's defences, a sensitivity
#: row that is labelled as such (a reproduction it is not).
DEFENCES = ("off", "default")
#: The run columns that record a run's defences (:func:`recorded_settings`): the switch,
#: then the value each bound of :data:`mmfl_flwr.config.BOUNDS` had in the run (0 = off)
DEFENCES_COLUMN = "defences"
#: What a run's recorded settings make it (:func:`run_status`)
REPRODUCTION, DEFENDED, UNKNOWN = "reproduction", "defended", "unknown"


def bound_names() -> tuple[str, ...]:
    """The bounds a run records (:data:`mmfl_flwr.config.BOUNDS`)."""
    from mmfl_flwr.config import BOUNDS

    return tuple(BOUNDS)


def defences_arg(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--defences {off,default}`` (default ``off``: the reproduction mode)."""
    parser.add_argument(
        "--defences",
        default="off",
        choices=DEFENCES,
        help="off (default): the papers' algorithms with every defence off, the "
        "reproduction mode; default: the project's defences on, a sensitivity row "
        "labelled as such",
    )
    return parser


def with_defences(settings: Mapping[str, Any], defences: str) -> dict[str, Any]:
    """``Settings`` keywords of a run in mode ``defences``: ``defences = "off"`` added for
    the reproduction mode; the project's defaults leave the keywords as they are (a
    cache's runs made before the switch keep their keys)."""
    if defences not in DEFENCES:
        raise ValueError(f"defences must be one of {', '.join(DEFENCES)}; got {defences!r}")
    return {**settings, "defences": "off"} if defences == "off" else dict(settings)


def bound_kwargs(defences: str) -> dict[str, float | None]:
    """``MultiModelStrategy`` keywords of the bounds in mode ``defences`` (None = off), as
    ``mmfl run`` builds them from its settings: for scripts that build their strategy."""
    from mmfl_flwr.config import Settings

    s = Settings(defences=defences)
    return {name: value or None for name, value in s.bounds().items()}


def recorded_settings(defences: str, bounds: Mapping[str, float | None]) -> dict[str, Any]:
    """The columns a run records: its defences switch and the value of every bound it
    applied (0.0 = off), so that :func:`run_status` can tell a defended run from a
    reproduction run."""
    return {DEFENCES_COLUMN: defences, **{n: float(bounds.get(n) or 0.0) for n in bound_names()}}


def applied_settings(strategy: Any, defences: str) -> dict[str, Any]:
    """:func:`recorded_settings` of a run of ``strategy`` (a ``MultiModelStrategy``),
    read from the bounds the strategy holds (what the run applies)."""
    limits = strategy.limits
    return recorded_settings(defences, {n: getattr(limits, n) for n in bound_names()})


#: Bounds added after runs began recording their settings, off by default: a run whose
#: record lacks one ran without it (it did not exist, or was not asked for), so a
#: missing value reads as 0 (every other bound missing makes the run unknown).
LATER_BOUNDS = ("collusion_factor",)


def run_status(record: Mapping[str, Any]) -> str:
    """:data:`REPRODUCTION` when a run's record (a CSV row, a cached row) gives its
    defences switch and every bound at 0; :data:`DEFENDED` when it gives them and a bound
    is on; :data:`UNKNOWN` when the switch or a bound is missing or unreadable (a run made
    before runs recorded them is never taken for a reproduction)."""
    switch = record.get(DEFENCES_COLUMN)
    if switch not in DEFENCES:
        return UNKNOWN
    values = []
    for name in bound_names():
        v = record.get(name, 0.0 if name in LATER_BOUNDS else None)
        try:
            x = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return UNKNOWN
        if math.isnan(x):
            return UNKNOWN
        values.append(x)
    return REPRODUCTION if all(x == 0 for x in values) else DEFENDED


def defences_of(rows: Iterable[Mapping[str, Any]]) -> str:
    """The one status (:func:`run_status`) of every row, or ``mixed``."""
    found = {run_status(r) for r in rows}
    return found.pop() if len(found) == 1 else "mixed" if found else UNKNOWN


def check_defences(
    parser: argparse.ArgumentParser,
    csv_path: str | Path,
    rows: Sequence[Mapping[str, Any]],
    defences: str,
) -> str:
    """Refuse (``parser.error``) re-analysing under ``--defences X`` runs that recorded
    another mode, or a mix of modes; returns the runs' status (:func:`run_status`),
    :data:`UNKNOWN` for runs made before runs recorded their settings (accepted: the
    fragment then says so)."""
    status = defences_of(rows)
    want = REPRODUCTION if defences == "off" else DEFENDED
    if status == "mixed":
        parser.error(f"--from-csv {csv_path}: its runs mix defended and reproduction runs")
    if status not in (want, UNKNOWN):
        parser.error(
            f"--from-csv {csv_path}: its runs are {status} runs, not --defences {defences}'s"
        )
    return status


def defences_text(status: str) -> str:
    """The sentence a section gives on its runs' defences (``status``: :func:`run_status`
    of the runs, or :func:`defences_of`)."""
    if status == REPRODUCTION:
        return (
            "Defences: off (reproduction mode, `--defences off`, the default): the "
            "papers' algorithms as the papers state them, every bound off."
        )
    if status == DEFENDED:
        return (
            "Defences: the project's defaults on (`--defences default`): a sensitivity "
            "row, not a reproduction of the papers' algorithms."
        )
    return (
        "Defences: not recorded. These runs were made before runs recorded their "
        "settings, with the project's defences of their day on: not a reproduction "
        "(`python benchmarks/check_reproduction.py` flags them); the command shown now "
        "runs the reproduction mode (`--defences off`)."
    )


def defences_heading(status: str) -> str:
    """A section heading's suffix for its runs' defences: the defended runs' sections
    (``--defences default``) are a sensitivity row of their own."""
    return ", project defences on (sensitivity)" if status == DEFENDED else ""


def _records_of(result: Any) -> list[Mapping[str, Any]]:
    """The run rows in a cached result: a list of row dicts, or a dict holding one."""
    if isinstance(result, list):
        return [r for r in result if isinstance(r, Mapping)]
    if isinstance(result, Mapping):
        for v in result.values():
            if isinstance(v, list) and v and all(isinstance(r, Mapping) for r in v):
                return list(v)
        return [result]
    return []


def _run_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(str(row.get(k)) for k in ("scenario", "method", "seed", "M", "dataset", "K"))


def check_file(path: str | Path) -> dict[str, Any] | None:
    """The runs of one published file and what their recorded settings make them
    (:func:`run_status`): ``{"path", "runs", "reproduction", "defended", "unknown"}``,
    or None for a file that holds no runs (a table derived from them). A run CSV is one
    with ``method``, ``seed``, ``round`` and ``accuracy`` columns (the history rows); a
    cache (``.jsonl``) is judged per cached run from the rows of its result."""
    path = Path(path)
    statuses: dict[tuple[Any, ...], set[str]] = {}
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            cols = set(reader.fieldnames or [])
            if not {"method", "seed", "round", "accuracy"} <= cols:
                return None
            for r in reader:
                statuses.setdefault(_run_key(r), set()).add(run_status(r))
    elif path.suffix == ".jsonl":
        with open(path) as f:
            for k, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    statuses[("cut line", k)] = {UNKNOWN}
                    continue
                rows = _records_of(entry.get("result")) if isinstance(entry, dict) else []
                found = {run_status(r) for r in rows} or {UNKNOWN}
                statuses[("line", k)] = found
    else:
        return None
    counts = {REPRODUCTION: 0, DEFENDED: 0, UNKNOWN: 0}
    for found in statuses.values():
        # a run is a reproduction only when every row of it says so
        status = DEFENDED if DEFENDED in found else UNKNOWN if UNKNOWN in found else REPRODUCTION
        counts[status] += 1
    return {"path": str(path), "runs": len(statuses), **counts}


def check_reproduction(folder: str | Path) -> list[dict[str, Any]]:
    """:func:`check_file` of every run CSV and cache under ``folder`` (sorted), the files
    that hold no runs left out."""
    found = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.suffix in (".csv", ".jsonl"):
            res = check_file(path)
            if res is not None:
                found.append(res)
    return found


# ---------------------------------------------------------------------------- runs
def _one(job: tuple[str, int, dict[str, Any], str]) -> list[dict[str, Any]]:
    method, seed, settings, engine = job
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    s = Settings(**{**settings, "seed": seed, "output_dir": ""})
    t0 = time.monotonic()
    result = run(s, engine=engine)
    wall = time.monotonic() - t0
    applied = recorded_settings(s.defences, s.bounds())
    rows = []
    for r in result.history:
        row = {"method": method, "seed": seed, **{k: v for k, v in r.items() if k != "seconds"}}
        row["run_seconds"] = round(wall, 3)
        row.update(applied)
        rows.append(row)
    return rows


def _key(job: Any) -> str:
    return json.dumps(job, sort_keys=True, default=str)


#: machine (``machine()``) of every result the latest :func:`map_cached` returned, in job
#: order: runs taken from a cache keep the machine that ran them
LAST_MACHINES: list[str] = []


def code_commit() -> str:
    """The short commit of the code (``mmfl_flwr.results._git_commit``, the one place that
    asks git), marked ``+changes`` when the code (``mmfl_flwr/``, ``benchmarks/``,
    ``pyproject.toml``) differs from it; outputs (``docs/``, ``RESULTS.md``) do not count,
    since a rerun rewrites them. ``"unknown"`` outside a git checkout."""
    import subprocess

    import mmfl_flwr
    from mmfl_flwr.results import _git_commit

    head = _git_commit(Path(mmfl_flwr.__file__).resolve().parent)
    if head is None:
        return "unknown"
    try:
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "mmfl_flwr", "benchmarks", "pyproject.toml"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        changed = ""
    return head[:7] + ("+changes" if changed else "")


def machines_used() -> str:
    """The machine(s) that ran the latest :func:`map_cached` call's jobs: one line, with
    the number of runs per machine where there were several."""
    if not LAST_MACHINES:
        return machine()
    counts: dict[str, int] = {}
    for m in LAST_MACHINES:
        counts[m] = counts.get(m, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return "; ".join(f"{n} runs on {m}" for m, n in counts.items())


def _refuse(message: str) -> None:
    """One line on stderr and exit code 2 (the scripts' way to refuse bad input)."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _load_cache(path: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The cache's finished runs. Only its last line may be cut short (a killed run); a
    file that is not such a cache is refused in one line (exit code 2)."""
    done: dict[str, Any] = {}
    where: dict[str, str] = {}
    if path is None or not path.exists():
        return done, where
    try:
        with open(path) as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as err:
        _refuse(f"--cache {path}: cannot read it ({err})")
    lines = [line for line in lines if line]
    for k, line in enumerate(lines):
        try:
            entry = json.loads(line)
            key, result = entry["key"], entry["result"]
        except (json.JSONDecodeError, KeyError, TypeError):
            if k == len(lines) - 1 and line.startswith('{"key": '):
                continue  # a line cut short by a killed run
            _refuse(
                f"--cache {path}: line {k + 1} is not a cached run (not a cache "
                "file this script wrote?)"
            )
        done[key] = result
        where[key] = entry.get("machine", "unknown machine")
    return done, where


def _drop_cut_line(path: Path) -> None:
    """Truncate a cache file after its last newline (a line without one was cut short)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def map_cached(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    workers: int = 1,
    cache: str | Path | None = None,
    label: Callable[[Any], str] = str,
) -> list[Any]:
    """``[fn(job) for job in jobs]``, in ``workers`` processes, printing one line per
    finished job (``label(job)``). ``cache``: a JSON-lines file; each finished job
    appends its (JSON-serialisable) result there, and jobs already in it (same key:
    the job's JSON) are not run again, so a long ``--full`` run that was stopped
    resumes where it was."""
    path = Path(cache) if cache else None
    done, where = _load_cache(path)
    here = machine()
    todo = [j for j in jobs if _key(j) not in done]
    if len(todo) < len(jobs):
        print(f"  {len(jobs) - len(todo)} of {len(jobs)} runs taken from {path}", flush=True)

    count = [len(jobs) - len(todo)]  # this call's jobs done (the cache may hold others)

    def finished(job: Any, result: Any) -> None:
        count[0] += 1
        done[_key(job)] = result
        where[_key(job)] = here
        if path is not None:
            # a killed run may have left a cut last line: drop it first, or this run's
            # line would be joined to it (and the next resume would refuse the file)
            _drop_cut_line(path)
            with open(path, "a") as f:
                f.write(json.dumps({"key": _key(job), "result": result, "machine": here}) + "\n")
        print(f"  {label(job)}: done ({count[0]}/{len(jobs)})", flush=True)

    if workers <= 1:
        for job in todo:
            finished(job, fn(job))
    elif todo:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(fn, job): job for job in todo}
            for fut in as_completed(futures):
                finished(futures[fut], fut.result())
    LAST_MACHINES[:] = [where[_key(j)] for j in jobs]
    return [done[_key(j)] for j in jobs]


def run_jobs_keys(
    jobs: Sequence[tuple[str, int, Mapping[str, Any]]], engine: str
) -> list[tuple[Any, ...]]:
    """The :func:`map_cached` jobs that :func:`run_many` makes of ``jobs``."""
    return [(m, int(s), dict(kw), engine) for m, s, kw in jobs]


def check_cache(cache: str | Path | None, jobs: Sequence[Any]) -> None:
    """Refuse (one line, exit code 2, before anything runs or is written) a ``--cache``
    file that is not a cache, or whose runs all belong to another configuration:
    they would not be mixed in, so the user most likely named the wrong file. ``jobs``:
    every :func:`map_cached` job of the script's configuration."""
    if not cache:
        return
    done, _ = _load_cache(Path(cache))
    if done and not any(_key(j) in done for j in jobs):
        _refuse(
            f"--cache {cache}: none of its {len(done)} runs belongs to this "
            "configuration (runs of another configuration are not mixed in; give "
            "another file)"
        )


def run_many(
    jobs: Sequence[tuple[str, int, Mapping[str, Any]]],
    engine: str = "vectorized",
    workers: int = 1,
    cache: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Run every ``(method, seed, settings)``; return all history rows, each tagged
    with ``method`` and ``seed`` (``seconds`` dropped: timings are not evidence), in
    job order. Prints one line per finished run; ``cache`` as in :func:`map_cached`."""
    full = run_jobs_keys(jobs, engine)
    results = map_cached(_one, full, workers, cache, label=lambda j: f"{j[0]} seed {j[1]}")
    return [row for rows in results for row in rows]


# ---------------------------------------------------------------------------- files
def run_time(rows: Sequence[Mapping[str, Any]]) -> float:
    """Sum of the runs' wall times (``run_seconds``, one per (method, seed) and any
    other tag that tells runs apart)."""
    seen: dict[tuple[Any, ...], float] = {}
    for r in rows:
        key = tuple(r.get(k) for k in ("scenario", "method", "seed", "M", "dataset", "K"))
        seen[key] = float(r.get("run_seconds") or 0.0)
    return sum(seen.values())


def run_time_text(rows: Sequence[Mapping[str, Any]], wall: float) -> str:
    """``summed run time X s (wall of this invocation Y s)``; runs taken from a cache
    cost nothing in this invocation."""
    return seconds_text(run_time(rows), wall)


def seconds_text(total: float, wall: float) -> str:
    """:func:`run_time_text` of an already summed run time ``total`` (0: not recorded,
    as in a re-analysis from a CSV); ``benchmarks/reproduce.py --dry-run`` reads its
    estimates from this text."""
    runs = f"summed run time {total:.0f} s" if total > 0 else "run times not recorded"
    return f"{runs} (wall of this invocation {wall:.0f} s)"


def write_long_csv(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write rows (dicts) as CSV; the columns are the union of the keys, first-seen order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(
                {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            )
    return path


def _cell(key: str, text: str) -> Any:
    if text == "":
        return ""
    try:
        f = float(text)
    except ValueError:
        return text
    if key in ("round", "seed", "K", "k") and f.is_integer():
        return int(f)
    return f


def rows_from_csv(
    parser: argparse.ArgumentParser,
    path: str | Path,
    keys: Sequence[str],
    required: Iterable[tuple[Any, ...]],
    rounds: int | Callable[[tuple[str, ...]], int] | None = None,
    longer: bool = False,
) -> list[dict[str, Any]]:
    """The rows of a long CSV written by :func:`write_long_csv` (numbers read back
    exactly: a float's text is its repr), for re-analysing published runs without
    running them again. ``required``: the ``keys`` values of every run the analysis
    needs (e.g. ``(method, seed)``); a CSV that is missing, does not parse, or lacks
    one of them (another configuration) is refused through ``parser.error`` (one line,
    exit code 2, nothing written). Rows of other runs are dropped, not mixed in.
    ``rounds``: the configuration's run length (or a function of a run's ``keys``
    values, as text, giving its length); runs of another length are refused
    (they are another configuration: arrivals, schedules), or with ``longer`` (where
    a run's first rounds are the shorter run) runs at least that long are cut there."""
    path = Path(path)
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing_cols = [k for k in keys if k not in (reader.fieldnames or [])]
            if missing_cols:
                parser.error(f"--from-csv {path}: no column(s) {missing_cols}")
            rows = [{k: _cell(k, v) for k, v in r.items()} for r in reader]
    except (OSError, csv.Error, UnicodeDecodeError) as err:
        parser.error(f"--from-csv {path}: cannot read it ({err})")
    want = {tuple(str(v) for v in t) for t in required}
    have = {tuple(str(r[k]) for k in keys) for r in rows}
    lacking = sorted(want - have)
    if lacking:
        parser.error(
            f"--from-csv {path}: lacks {len(lacking)} of the {len(want)} runs this "
            f"configuration needs (e.g. {dict(zip(keys, lacking[0]))}): it comes "
            "from another configuration"
        )
    kept = [r for r in rows if tuple(str(r[k]) for k in keys) in want]
    if rounds is not None:
        ends: dict[tuple[str, ...], int] = {}
        for r in kept:
            run = tuple(str(r[k]) for k in keys)
            ends[run] = max(ends.get(run, 0), int(r["round"]))
        length = rounds if callable(rounds) else (lambda run, n=rounds: n)
        wrong = sorted(
            (n, run)
            for run, n in ends.items()
            if n < length(run) or (n > length(run) and not longer)
        )
        if wrong:
            n, run = wrong[0]
            parser.error(
                f"--from-csv {path}: its runs last {n} rounds (e.g. "
                f"{dict(zip(keys, run))}), this configuration's {length(run)}"
                + (" or more" if longer else "")
                + ": it comes from another "
                "configuration"
            )
        kept = [r for r in kept if int(r["round"]) <= length(tuple(str(r[k]) for k in keys))]
    return kept


def model_names(kinds: Sequence[str]) -> list[str]:
    """The models' names of a run of these task kinds (``--tasks``): each kind, its
    repeats named ``kind_2``, ``kind_3``, ... (as :mod:`mmfl_flwr` names them)."""
    seen: dict[str, int] = {}
    names = []
    for k in kinds:
        seen[k] = seen.get(k, 0) + 1
        names.append(k if seen[k] == 1 else f"{k}_{seen[k]}")
    return names


def check_csv_models(
    parser: argparse.ArgumentParser,
    csv_path: str | Path,
    rows: Sequence[dict[str, Any]],
    kinds: Sequence[str],
    flag: str,
    *,
    exact: bool = True,
) -> None:
    """Refuse (``parser.error``) re-analysing a CSV whose runs train other models than
    ``kinds`` (given by ``flag``): with ``exact`` the models' names must be
    :func:`model_names` of ``kinds``; without it (runs whose models differ, e.g. by
    scenario) only their kinds must be those of ``kinds``."""
    import re

    names = sorted({str(r["task"]) for r in rows})
    if exact:
        want = sorted(model_names(kinds))
        if names != want:
            parser.error(
                f"--from-csv {csv_path}: its runs train the models {names}, not "
                f"{want} ({flag} {','.join(kinds)})"
            )
        return
    got = sorted({re.sub(r"_\d+$", "", n) for n in names})
    if got != sorted(set(kinds)):
        parser.error(
            f"--from-csv {csv_path}: its runs train models of kind "
            f"{', '.join(repr(k) for k in got)}, not "
            f"{', '.join(repr(k) for k in sorted(set(kinds)))} ({flag})"
        )


def check_configuration(
    parser: argparse.ArgumentParser, csv_path: str | Path, name: str, needles: Sequence[str]
) -> None:
    """Refuse (``parser.error``: one line, exit code 2, nothing written) re-analysing a
    CSV whose runs were made with another configuration than this invocation's: the
    section ``<name>.md`` written beside the CSV with its runs must state each of
    ``needles`` (the scale's text for this configuration: clients, epochs, ...), which
    the CSV itself does not record."""
    beside = Path(csv_path).with_name(f"{name}.md")
    if not beside.is_file():
        parser.error(
            f"--from-csv {csv_path}: no {name}.md beside it, which states the "
            "configuration its runs were made with"
        )
    text = " ".join(beside.read_text().split())
    missing = [n for n in needles if " ".join(n.split()) not in text]
    if missing:
        parser.error(
            f"--from-csv {csv_path}: its runs were made with another configuration "
            f"({beside} does not state {missing[0]!r}); give the mode and options "
            "they were run with"
        )


def reanalysed_machine(out: str | Path, name: str, csv_path: str | Path) -> str:
    """The machine line of a section re-analysed from ``csv_path``: the machine that ran
    the runs, read from the ``Machine:`` (or ``machine:``) of the fragment
    ``<out>/<name>.md`` they wrote, and the machine that re-analysed them."""
    import re

    ran = "not recorded"
    # the fragment the runs came with (beside their CSV), else the one in the output folder
    beside = Path(csv_path).with_name(f"{name}.md")
    path = beside if beside.is_file() else Path(out) / f"{name}.md"
    if path.is_file():
        text = path.read_text()
        # "Machine: X." / "machine: X; summed run time ..." / (Table 1 before it named
        # the machine) "engine `e`; X; summed run time ..."
        found = re.search(r"[Mm]achine: (.+)", text) or re.search(
            r"engine `\w+`; (.+?; (?:summed run time|run times not))", text
        )
        if found:
            ran = (
                re.split(r" \(re-analysed|; summed run time|; run times not", found.group(1))[0]
                .strip()
                .rstrip(".")
            )
    return f"{ran} (re-analysed from `{csv_path}` on {machine()})"


def write_fragment(out: str | Path, name: str, text: str) -> Path:
    """Write the experiment's Markdown fragment ``<out>/<name>.md``."""
    path = Path(out) / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip() + "\n")
    return path


# ------------------------------------------------------------------------ statistics
def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df))


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and the ``level`` t confidence interval of the mean: ``(mean, lo, hi)``.
    A single value has an infinite interval."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("no values")
    m = statistics.fmean(vals)
    if len(vals) == 1:
        return m, -math.inf, math.inf
    half = t_quantile(len(vals) - 1, level) * statistics.stdev(vals) / math.sqrt(len(vals))
    return m, m - half, m + half


def _diffs(values: Mapping[int, float], reference: Mapping[int, float]) -> list[float]:
    seeds = sorted(set(values) & set(reference))
    if not seeds:
        raise ValueError("no seed in common")
    return [float(values[s]) - float(reference[s]) for s in seeds]


def paired_ci(
    values: Mapping[int, float], reference: Mapping[int, float], level: float = 0.95
) -> dict[str, Any]:
    """Paired difference ``values[seed] - reference[seed]`` over the seeds both have:
    mean, ``level`` t interval, number of pairs and a verdict: ``better`` (the interval
    lies above 0), ``worse`` (below 0) or ``level`` (it covers 0)."""
    diffs = _diffs(values, reference)
    m, lo, hi = mean_ci(diffs, level)
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "level"
    return {"mean": m, "lo": lo, "hi": hi, "n": len(diffs), "verdict": verdict}


def equivalence(
    values: Mapping[int, float],
    reference: Mapping[int, float],
    margin: float,
    level: float = 0.95,
) -> dict[str, Any]:
    """Paired TOST (two one-sided t tests) of ``values - reference`` against the
    equivalence margin ``+-margin``, at ``alpha = 1 - level``: ``equivalent`` when
    both one-sided tests reject, i.e. the ``1 - 2 alpha`` t interval of the mean
    difference lies inside ``(-margin, margin)``; otherwise ``not shown equivalent``.
    Assumes the per-seed differences are independent draws of a roughly normal
    variable (t test). Returns mean, the ``1 - 2 alpha`` interval (lo, hi), the TOST
    p-value (the larger one-sided p), n, margin and the verdict."""
    from scipy import stats

    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    diffs = _diffs(values, reference)
    n = len(diffs)
    m = statistics.fmean(diffs)
    if n < 2:
        return {
            "mean": m,
            "lo": -math.inf,
            "hi": math.inf,
            "p": 1.0,
            "n": n,
            "margin": margin,
            "verdict": "not shown equivalent",
        }
    se = statistics.stdev(diffs) / math.sqrt(n)
    alpha = 1.0 - level
    q = float(stats.t.ppf(1.0 - alpha, n - 1))
    if se == 0:
        p = 0.0 if abs(m) < margin else 1.0
    else:
        p_low = float(stats.t.sf((m + margin) / se, n - 1))  # H0: diff <= -margin
        p_high = float(stats.t.cdf((m - margin) / se, n - 1))  # H0: diff >= +margin
        p = max(p_low, p_high)
    lo, hi = m - q * se, m + q * se
    # both one-sided tests reject exactly when the 1 - 2 alpha interval is inside
    verdict = "equivalent" if -margin < lo and hi < margin else "not shown equivalent"
    return {"mean": m, "lo": lo, "hi": hi, "p": p, "n": n, "margin": margin, "verdict": verdict}


def _nonzero_digits(x: float, digits: int, kind: str) -> str:
    """``x`` with its sign in format ``kind`` (``f`` or ``%``) to ``digits`` decimals,
    or up to 3 more where fewer would print a nonzero value as zero."""
    for d in range(digits, digits + 4):
        text = f"{x:+.{d}{kind}}"
        if x == 0 or text.strip("+-0.%") != "":
            return text
    return f"{x * (100 if kind == '%' else 1):+.1e}" + ("%" if kind == "%" else "")


def signed(x: float) -> str:
    """``x`` to 3 decimals with its sign, with more where 3 would print a nonzero
    value as +-0.000 (an interval ending at -0.0002 excludes 0; "-0.000" would not
    say so)."""
    return _nonzero_digits(x, 3, "f")


def signed_pct(x: float) -> str:
    """``x`` as a signed percentage to one decimal, with more where one would print a
    nonzero value as +-0.0% (as :func:`signed`)."""
    return _nonzero_digits(x, 1, "%")


def equivalence_verdict(d: Mapping[str, Any]) -> str:
    """The rule for an equivalence claim from :func:`equivalence`'s result: **holds**
    when the 90% interval lies inside the margin, **does not hold** when it lies
    entirely outside it (beyond one side), **not resolved** otherwise."""
    if d["verdict"] == "equivalent":
        return "holds"
    if d["lo"] >= d["margin"] or d["hi"] <= -d["margin"]:
        return "does not hold"
    return "not resolved"


def equivalence_at_half(
    values: Mapping[int, float], reference: Mapping[int, float], margin: float
) -> tuple[dict[str, Any], str, str]:
    """An equivalence claim on a margin this project chose, stated with its verdict at
    half the margin too (issue 61): :func:`equivalence` at ``margin``, the verdict at
    half of it, and the text "<verdict> within ±m; <verdict> within ±m/2 (half the chosen
    margin)". The claim counts by the verdict at ``margin``."""
    d = equivalence(values, reference, margin)
    half = equivalence_verdict(equivalence(values, reference, margin / 2))
    text = (
        f"{equivalence_verdict(d)} within ±{margin:g}; "
        f"{half} within ±{margin / 2:g} (half the chosen margin)"
    )
    return d, half, text


def brown_forsythe_greater(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """One-sided Brown-Forsythe test that ``x`` spreads more than ``y``: a t test on
    the absolute deviations from each sample's median, in Welch's form (unequal
    variances of the deviations, Welch-Satterthwaite degrees of freedom; the classic
    Brown-Forsythe F for two groups is the square of the pooled-variance t on the same
    deviations). Assumes two independent samples; robust to non-normal data, not free
    of assumptions. Returns ``t`` and both one-sided p-values: NaN (not significant)
    with fewer than 3 values a sample, or when either sample's deviations are all
    equal (conservative: Welch's t is still defined when only one sample's are)."""
    from scipy import stats

    dx = [abs(v - statistics.median(x)) for v in x]
    dy = [abs(v - statistics.median(y)) for v in y]
    if min(len(x), len(y)) < 3 or statistics.variance(dx) == 0 or statistics.variance(dy) == 0:
        return {"t": math.nan, "p_greater": math.nan, "p_less": math.nan}
    t, _ = stats.ttest_ind(dx, dy, equal_var=False)
    vx, vy = statistics.variance(dx) / len(dx), statistics.variance(dy) / len(dy)
    df_den = vx**2 / (len(dx) - 1) + vy**2 / (len(dy) - 1)
    df = (vx + vy) ** 2 / df_den if df_den > 0 else len(dx) + len(dy) - 2
    return {
        "t": float(t),
        "p_greater": float(stats.t.sf(t, df)),
        "p_less": float(stats.t.cdf(t, df)),
    }


def spread_verdict(
    x: Sequence[float], y: Sequence[float], alpha: float = 0.05
) -> tuple[str, dict[str, float]]:
    """The rule for a variance claim "x spreads more than y" on two independent
    samples (the data held fixed, only the sampling varied): **holds** when the
    one-sided Brown-Forsythe test shows it at ``alpha``, **does not hold** when it
    shows the reverse, **not resolved** otherwise. Returns the verdict and the test."""
    bf = brown_forsythe_greater(x, y)
    verdict = (
        "holds"
        if bf["p_greater"] < alpha
        else "does not hold"
        if bf["p_less"] < alpha
        else "not resolved"
    )
    return verdict, bf


def size_test(
    values: Mapping[int, float],
    reference: Mapping[int, float],
    size: float,
    level: float = 0.95,
) -> dict[str, Any]:
    """Is the paired difference ``values - reference`` at least ``size``? One-sided
    t bounds at ``level``: ``size shown`` when the lower bound is above ``size``,
    ``smaller than claimed`` when the upper bound is below it, ``size not resolved``
    otherwise. Reported apart from the direction (:func:`paired_ci`): a difference
    can be clearly positive and still short of the claimed size."""
    from scipy import stats

    diffs = _diffs(values, reference)
    n = len(diffs)
    m = statistics.fmean(diffs)
    if n < 2:
        return {
            "mean": m,
            "lo": -math.inf,
            "hi": math.inf,
            "n": n,
            "size": size,
            "verdict": "size not resolved",
        }
    half = float(stats.t.ppf(level, n - 1)) * statistics.stdev(diffs) / math.sqrt(n)
    lo, hi = m - half, m + half
    verdict = (
        "size shown" if lo > size else "smaller than claimed" if hi < size else "size not resolved"
    )
    return {"mean": m, "lo": lo, "hi": hi, "n": n, "size": size, "verdict": verdict}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` against ``xs`` (at least two distinct ``xs``)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.fsum(
        (x - mx) ** 2 for x in xs
    )


def trend(per_seed: Mapping[int, Mapping[float, float]], level: float = 0.95) -> dict[str, Any]:
    """A "widening" claim: per seed, the least-squares slope of ``y`` against ``x``
    (``per_seed[seed] = {x: y}``), then the t interval of the mean slope over seeds:
    ``widening`` when it lies above 0, ``narrowing`` below, ``no trend shown``
    otherwise."""
    slopes = [
        slope(list(points), list(points.values()))
        for points in per_seed.values()
        if len(set(points)) >= 2
    ]
    if not slopes:
        raise ValueError("no seed with two distinct x")
    m, lo, hi = mean_ci(slopes, level)
    verdict = "widening" if lo > 0 else "narrowing" if hi < 0 else "no trend shown"
    return {"mean": m, "lo": lo, "hi": hi, "n": len(slopes), "verdict": verdict}


def final_values(
    rows: Sequence[Mapping[str, Any]], metric: str = "accuracy", last: int = 1
) -> dict[str, dict[int, float]]:
    """Per method and seed: ``metric`` averaged over the models and over the last
    ``last`` rounds of the run (rows with a NaN or empty value are skipped)."""
    by: dict[tuple[str, int], dict[int, list[float]]] = {}
    for r in rows:
        v = r.get(metric)
        if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
            continue
        by.setdefault((r["method"], int(r["seed"])), {}).setdefault(int(r["round"]), []).append(
            float(v)
        )
    out: dict[str, dict[int, float]] = {}
    for (method, seed), rounds in by.items():
        tail = sorted(rounds)[-last:]
        out.setdefault(method, {})[seed] = statistics.fmean(
            statistics.fmean(rounds[r]) for r in tail
        )
    return out


def window_means(
    rows: Iterable[Mapping[str, Any]], key: str, first: int, last: int
) -> dict[str, dict[int, float]]:
    """``{method: {seed: mean of key}}`` over rounds ``first..last`` (inclusive), each
    round's value averaged over the models first."""
    per: dict[tuple[str, int, int], list[float]] = {}
    for r in rows:
        rd = int(r["round"])
        v = r.get(key)
        if first <= rd <= last and v not in (None, ""):
            per.setdefault((str(r["method"]), int(r["seed"]), rd), []).append(float(v))
    out: dict[str, dict[int, list[float]]] = {}
    for (m, s, _), vs in per.items():
        out.setdefault(m, {}).setdefault(s, []).append(statistics.fmean(vs))
    return {m: {s: statistics.fmean(v) for s, v in seeds.items()} for m, seeds in out.items()}


def compare_to_reference(
    finals: Mapping[str, Mapping[int, float]], reference: str, level: float = 0.95
) -> list[dict[str, Any]]:
    """One row per method: mean and CI of its final value, and the paired difference to
    ``reference`` (absent for the reference itself)."""
    rows = []
    for method, per_seed in finals.items():
        m, lo, hi = mean_ci(list(per_seed.values()), level)
        row: dict[str, Any] = {
            "method": method,
            "mean": m,
            "lo": lo,
            "hi": hi,
            "seeds": len(per_seed),
        }
        if method != reference and reference in finals:
            d = paired_ci(per_seed, finals[reference], level)
            row.update(
                {"diff": d["mean"], "diff_lo": d["lo"], "diff_hi": d["hi"], "verdict": d["verdict"]}
            )
        rows.append(row)
    return rows


def markdown_table(rows: Sequence[Mapping[str, Any]], reference: str, value: str) -> str:
    """A Markdown table of :func:`compare_to_reference` rows."""
    lines = [
        f"| method | {value} (mean, 95% CI) | seeds | vs {reference} (paired, 95% CI) | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ci = f"{r['mean']:.4f} [{r['lo']:.4f}, {r['hi']:.4f}]"
        if "diff" in r:
            d = f"{r['diff']:+.4f} [{r['diff_lo']:+.4f}, {r['diff_hi']:+.4f}]"
            verdict = r["verdict"]
        else:
            d, verdict = "reference", ""
        lines.append(f"| {r['method']} | {ci} | {r['seeds']} | {d} | {verdict} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- plots
def _pyplot() -> Any:
    import matplotlib

    if not os.environ.get("DISPLAY"):
        matplotlib.use("Agg")  # a script, not the library: no display here
    import matplotlib.pyplot as plt

    return plt


def curves(
    rows: Sequence[Mapping[str, Any]],
    metric: str = "accuracy",
    key: Callable[[Mapping[str, Any]], str] = lambda r: str(r["method"]),
) -> dict[str, dict[int, dict[int, float]]]:
    """``{label: {seed: {round: metric averaged over the models}}}``."""
    acc: dict[str, dict[int, dict[int, list[float]]]] = {}
    for r in rows:
        v = r.get(metric)
        if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
            continue
        acc.setdefault(key(r), {}).setdefault(int(r["seed"]), {}).setdefault(
            int(r["round"]), []
        ).append(float(v))
    return {
        lab: {s: {rd: statistics.fmean(v) for rd, v in per.items()} for s, per in seeds.items()}
        for lab, seeds in acc.items()
    }


def plot_curves(
    path: str | Path,
    data: Mapping[str, Mapping[int, Mapping[int, float]]],
    title: str,
    ylabel: str = "accuracy (mean over models)",
    xlabel: str = "round",
) -> Path:
    """Mean curve per label with a shaded 95% t band over seeds."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, seeds in data.items():
        rounds = sorted({rd for per in seeds.values() for rd in per})
        means, los, his = [], [], []
        for rd in rounds:
            vals = [per[rd] for per in seeds.values() if rd in per]
            m, lo, hi = mean_ci(vals)
            means.append(m)
            los.append(lo if math.isfinite(lo) else m)
            his.append(hi if math.isfinite(hi) else m)
        (line,) = ax.plot(rounds, means, label=f"{label} ({len(seeds)} seeds)")
        ax.fill_between(rounds, los, his, alpha=0.2, color=line.get_color(), linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_final(
    path: str | Path,
    finals: Mapping[str, Mapping[int, float]],
    title: str,
    ylabel: str = "final accuracy (mean over models)",
) -> Path:
    """Box plot (with the per-seed points) of a final value per label."""
    plt = _pyplot()
    labels = list(finals)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(labels) + 2), 4.5))
    data = [list(finals[lab].values()) for lab in labels]
    ax.boxplot(data)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, ha="right")
    for i, vals in enumerate(data, start=1):
        ax.scatter([i] * len(vals), vals, s=10, alpha=0.6)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------ comparison scripts
def run_jobs(
    fn: Callable[[Any], dict[str, Any]],
    jobs: Sequence[Any],
    workers: int,
    describe: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """Run ``fn`` over ``jobs`` in ``workers`` processes (results in job order),
    printing ``describe(result)`` as each one finishes."""
    runs = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for r in pool.map(fn, jobs):
            runs.append(r)
            print("  " + describe(r), flush=True)
    return runs


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def write_outputs(json_path: str, markdown_path: str, payload: dict[str, Any], table: str) -> None:
    """Write the numbers (``--json``) and the table (``--markdown``) when asked."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(payload, f, indent=2)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(table + "\n")
