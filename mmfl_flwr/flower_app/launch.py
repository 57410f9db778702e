"""``mmfl run`` on Flower's supported simulation path: a private SuperLink with
the simulation runtime, and ``flwr run``.

What :func:`run_on_superlink` does, step by step (each a plain Flower command):

1. writes a Flower App folder in a temporary directory: a ``pyproject.toml``
   whose ``[tool.flwr.app.config]`` holds every setting of the run and whose
   components are this package's ServerApp and ClientApp;
2. starts ``flower-superlink --simulation`` on a free port of 127.0.0.1, with a
   private ``FLWR_HOME`` (nothing of the user's Flower configuration is read
   or changed) and the app's dependencies taken from this environment;
3. submits the app with ``flwr run APP mmfl --stream --federation-config
   "num-supernodes=M client-resources-num-cpus=C ..."``: M = ceil(N / K) virtual
   SuperNodes on Ray, each hosting K = ``clients-per-node`` clients and computing
   them per model at once (``auto``: one node per CPU Ray sees, or per GPU share
   with ``num_gpus_per_node``; K = 1 is one node per client), C the CPUs each
   node's torch may use;
4. shows the run's log that this ``flwr run --stream`` streams (the ``[mmfl]``
   progress lines, warnings and errors; everything with ``verbose``), in the
   same process (each Flower CLI process costs 2-4 s of CPU to start);
5. when the log ends without the ServerApp's last line (its results written),
   asks ``flwr ls`` for the run's status and reports it; then stops the
   SuperLink and its children, and reads the result back from the run's
   output folder.

Bigger experiments (:func:`plan_ray`, checked before anything starts):

- ``num_gpus_per_client=F`` adds ``client-resources-num-gpus=F`` to the
  federation config: Flower's Ray backend gives each ClientApp actor ``F`` GPUs
  (``RayBackend`` in ``flwr/server/superlink/fleet/vce/backend/raybackend.py``)
  and runs ``min(CPUs, GPUs / F)`` ClientApps at a time on each node
  (``pool_size_from_resources`` in ``flwr/simulation/ray_transport/ray_actor.py``).
- ``ray_address=ADDR`` (or ``RAY_ADDRESS`` in the environment) joins an existing
  Ray cluster. Flower 1.42's federation config has no key for an address
  (``SimulationConfig`` has ``init-args-num-cpus``/``-num-gpus``/``-logging-level``/
  ``-log-to-driver`` only), and its backend calls ``ray.init(**init_args)``
  without one, so Ray takes the address from ``RAY_ADDRESS``: it is set in the
  SuperLink's environment, which ``flower-superexec`` and ``flwr-simulation``
  inherit. ``init-args-num-cpus`` is then left out (Ray refuses ``num_cpus`` for
  an existing cluster).

What is submitted (the app folder, the Flower home, the SuperLink's
environment) is :mod:`mmfl_flwr.flower_app.app_folder`; reading and showing the
streamed log is :mod:`mmfl_flwr.flower_app.run_log`; both are re-exported here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.app_folder import CLIENTS_PER_NODE_USED_KEY as CLIENTS_PER_NODE_USED_KEY
from mmfl_flwr.flower_app.app_folder import CONNECTION as CONNECTION
from mmfl_flwr.flower_app.app_folder import app_pyproject as app_pyproject
from mmfl_flwr.flower_app.app_folder import launched_run_config as launched_run_config
from mmfl_flwr.flower_app.app_folder import remove_run_files, superlink_env, write_app
from mmfl_flwr.flower_app.app_folder import remove_stale_shared_data as remove_stale_shared_data
from mmfl_flwr.flower_app.run_log import _ANSI, _last_line, _status
from mmfl_flwr.flower_app.run_log import RESULTS_LINE as RESULTS_LINE
from mmfl_flwr.flower_app.run_log import SimulationError as SimulationError
from mmfl_flwr.flower_app.run_log import _echo as _echo
from mmfl_flwr.flower_app.run_log import _show as _show
from mmfl_flwr.flower_app.run_log import flwr_reason as flwr_reason
from mmfl_flwr.flower_app.run_log import follow_run_log as follow_run_log
from mmfl_flwr.flower_app.supervise import end_tree
from mmfl_flwr.nodes import NodeLayout

#: seconds ``flwr run`` may take to submit the app and name the run
SUBMIT_TIMEOUT = 300.0


def _exe(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise SimulationError(f"'{name}' not found; install flwr[simulation] in this environment")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SimulationError(
                f"flower-superlink exited with {proc.returncode}: {_last_line(log)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if 200 <= resp.status < 300:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SimulationError(f"flower-superlink did not come up on port {port} in {timeout:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the SuperLink and everything it started: its supervisor
    (:mod:`.supervise`) ends the whole process tree."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            end_tree(proc.pid)


# ------------------------------------------------------------- GPUs and Ray clusters
#: Run in a subprocess by :func:`_probe_cluster`: connect to the cluster as a
#: driver, print its GCS address and the CPUs and GPUs of each live node.
_PROBE = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
try:
    import ray
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    nodes = [{"CPU": float(n["Resources"].get("CPU", 0)),
              "GPU": float(n["Resources"].get("GPU", 0))}
             for n in ray.nodes() if n.get("Alive") and n.get("Resources")]
    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:
        gcs = None
    print("MMFL-PROBE " + json.dumps({"address": gcs, "nodes": nodes}), flush=True)
    ray.shutdown()
except BaseException as err:
    text = " ".join(str(err).split()) or type(err).__name__
    print("MMFL-PROBE-ERROR " + type(err).__name__ + ": " + text[:400], flush=True)
    sys.exit(1)
"""


@dataclass(frozen=True)
class RayPlan:
    """Where the ClientApps run: ``address`` is the GCS address of an existing Ray
    cluster (None: a Ray instance of this machine that Flower starts), ``nodes``
    the CPUs and GPUs of each node, ``slots`` how many ClientApps run at a time
    (Flower's ``pool_size_from_resources``: ``min(CPUs, GPUs / F)`` per node)."""

    address: str | None
    nodes: tuple[tuple[float, float], ...]
    #: GPUs of each ClientApp actor (a Flower node: one client, or a shard)
    num_gpus_per_client: float
    slots: int
    #: what one ClientApp actor runs: "client" or "node"
    unit: str = "client"

    def describe(self) -> str:
        """One line for the log: where, how many nodes, CPUs, GPUs, slots."""

        def n(count: float, what: str) -> str:
            return f"{count:g} {what}{'' if count == 1 else 's'}"

        cpus = n(sum(c for c, _ in self.nodes), "CPU")
        gpus = n(sum(g for _, g in self.nodes), "GPU")
        where = (
            f"Ray cluster at {self.address}: {n(len(self.nodes), 'node')}, "
            if self.address
            else "Ray on this machine: "
        )
        per = (
            f"{self.num_gpus_per_client:g} GPU and 1 CPU per {self.unit}"
            if self.num_gpus_per_client
            else f"1 CPU per {self.unit}"
        )
        return f"{where}{cpus}, {gpus}; {per}, up to {n(self.slots, self.unit)} at a time"


def check_num_gpus_per_client(value: float, flag: str = "--num-gpus-per-client") -> float:
    """``value`` as a float if it is a valid GPU share per client (or per node,
    ``flag``): in [0, 1] (a fraction of one GPU, as Ray allows) or a whole
    number of GPUs; else ValueError (one line)."""
    unit = "nodes" if flag.endswith("node") else "clients"
    try:
        gpus = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} {value!r}: not a number") from None
    if not math.isfinite(gpus) or gpus < 0 or (gpus > 1 and not gpus.is_integer()):
        raise ValueError(
            f"{flag} {value}: must be in [0, 1] (a share of one GPU, "
            f"e.g. 0.25 for 4 {unit} per GPU) or a whole number of GPUs (Ray's rule)"
        )
    return gpus


def _slots(nodes: tuple[tuple[float, float], ...], num_gpus: float) -> int:
    """ClientApps that fit at a time with 1 CPU and ``num_gpus`` GPUs each, node by
    node, exactly as Flower's ``pool_size_from_resources`` counts them."""
    total = 0
    for cpus, gpus in nodes:
        n = int(cpus / 1)
        if num_gpus > 0:
            n = min(n, int(gpus / num_gpus)) if gpus else 0
        total += n
    return total


def local_gpus() -> int:
    """GPUs that a Ray instance started here would see: Ray's own detection
    (NVIDIA, AMD, Intel GPUs, capped by ``CUDA_VISIBLE_DEVICES`` and its likes),
    else ``torch.cuda.device_count()``."""
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager = get_accelerator_manager_for_resource("GPU")
    except (ImportError, AttributeError):  # a Ray without this private API
        manager = None
    if manager is not None:
        count = int(manager.get_current_node_num_accelerators())
        visible = manager.get_current_process_visible_accelerator_ids()
        return min(count, len(visible)) if visible is not None else count
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


def _check_reachable(address: str) -> None:
    """A quick TCP check of ``HOST:PORT``: Ray itself retries a wrong address for
    minutes before it gives up."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ValueError(
            f"{address}: expected HOST:PORT (the head node's address, as `ray start "
            "--head` prints it), ray://HOST:PORT or auto"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=5.0):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ValueError(
            f"{address}: no Ray cluster answers there ({reason}); start one with "
            f"`ray start --head --port={port}` or check the address"
        ) from None


@lru_cache(maxsize=8)
def _probe_cluster(address: str) -> tuple[str, tuple[tuple[float, float], ...]]:
    """``(GCS address, ((CPUs, GPUs) per live node))`` of the Ray cluster at
    ``address``, from a short-lived driver in a subprocess (so that this process
    never holds a Ray connection). Raises ValueError (one line, starting with
    ``address``)."""
    if address != "auto":
        _check_reachable(address.split("://", 1)[-1])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0", RAY_USAGE_STATS_ENABLED="0")
    try:
        res = subprocess.run(
            [sys.executable, "-c", _PROBE, address],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"{address}: Ray did not connect within 90 s (is it a Ray "
            "head node, of the same Ray version?)"
        ) from None
    lines = res.stdout.splitlines()
    found = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("MMFL-PROBE ")]
    if res.returncode != 0 or not found:
        errors = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("MMFL-PROBE-ERROR ")]
        reason = errors[0] if errors else _ANSI.sub("", (res.stderr or "").strip()[-300:])
        if address == "auto" and "Could not find any running Ray instance" in reason:
            reason = "no Ray cluster started here with `ray start` was found"
        raise ValueError(f"{address}: cannot join that Ray cluster: {reason}")
    info = json.loads(found[-1])
    nodes = tuple((float(n["CPU"]), float(n["GPU"])) for n in info["nodes"])
    gcs = str(info.get("address") or "")
    keep = address.startswith("ray://") or not gcs  # Ray Client: keep the ray:// form
    return (address if keep else gcs), nodes


def plan_ray(
    num_gpus_per_client: float = 0.0,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    num_gpus_per_node: float | None = None,
) -> RayPlan:
    """Check, before anything starts, that Flower's Ray backend can run at least one
    ClientApp with 1 CPU and ``num_gpus_per_client`` GPUs, on this machine or on the
    Ray cluster at ``ray_address`` (else ``RAY_ADDRESS`` of the environment;
    ``auto`` is the cluster that ``ray start`` last started here). Raises
    ValueError with a one-line reason: an invalid GPU share, GPUs asked for where
    Ray sees none (Flower would stop the run with "ActorPool is empty"), an
    unreachable cluster, or ``num_cpus`` for an existing cluster (Ray refuses it).
    ``num_gpus_per_node`` (instead of ``num_gpus_per_client``) is the GPU share
    of each node hosting a shard of clients (``clients-per-node``).
    """
    flag = "--num-gpus-per-client"
    if num_gpus_per_node is not None:
        if num_gpus_per_client:
            raise ValueError(
                "--num-gpus-per-client and --num-gpus-per-node exclude each "
                "other: give the GPU share of a node (it hosts "
                "clients-per-node clients)"
            )
        num_gpus_per_client, flag = num_gpus_per_node, "--num-gpus-per-node"
    gpus = check_num_gpus_per_client(num_gpus_per_client, flag)
    address = (ray_address or "").strip() or None
    from_env = address is None and bool(os.environ.get("RAY_ADDRESS", "").strip())
    if from_env:
        address = os.environ["RAY_ADDRESS"].strip()
    if address == "local":  # Ray's word for "start a new local instance"
        address = None
    if address is not None and num_cpus is not None and not from_env:
        raise ValueError(
            f"--num-cpus {num_cpus} and --ray-address {address} exclude each other: "
            "--num-cpus sizes the Ray instance mmfl starts on this machine, while the "
            "nodes of an existing cluster bring their own CPUs (ray start --num-cpus)"
        )
    if address is not None:
        try:
            resolved, nodes = _probe_cluster(address)
        except ValueError as err:
            raise ValueError(f"{'RAY_ADDRESS=' if from_env else '--ray-address '}{err}") from None
        where = f"the Ray cluster at {address}" + (f" ({resolved})" if resolved != address else "")
    else:
        resolved = None
        nodes = ((float(num_cpus or os.cpu_count() or 1), float(local_gpus() if gpus else 0)),)
        where = "this machine"
    slots = _slots(nodes, gpus)
    if slots == 0:
        most_gpus = max((g for _, g in nodes), default=0.0)
        if gpus > 0 and most_gpus == 0:
            hint = (
                " (CUDA_VISIBLE_DEVICES is empty)"
                if address is None and os.environ.get("CUDA_VISIBLE_DEVICES") == ""
                else ""
            )
            raise ValueError(
                f"{flag} {num_gpus_per_client:g}: Ray sees no GPU on "
                f"{where}{hint}; leave the flag out (or 0) to train the clients on CPUs"
            )
        if gpus > 0 and most_gpus < gpus:
            raise ValueError(
                f"{flag} {num_gpus_per_client:g}: no node of {where} has "
                f"that many GPUs (the most is {most_gpus:g}); a "
                f"{'Flower node' if flag.endswith('node') else 'client'} runs on one "
                "Ray node"
            )
        raise ValueError(
            f"{where} has no free CPU for a client (Ray reports "
            f"{sum(c for c, _ in nodes):g} CPUs on {len(nodes)} nodes)"
        )
    return RayPlan(
        address=resolved,
        nodes=nodes,
        num_gpus_per_client=gpus,
        slots=slots,
        unit="node" if flag.endswith("node") else "client",
    )


def resolve_clients_per_node(
    settings: Settings, plan: RayPlan, per_client_gpus: bool = False
) -> tuple[int, str]:
    """``(K, why)``: the clients each Flower virtual node hosts. An explicit
    ``clients-per-node`` as it is; ``auto``: one node per ClientApp that
    Ray can run at a time (``plan.slots``: one per CPU, or per GPU share with
    ``--num-gpus-per-node``), so that every worker computes its shard at once;
    1 (one node per client, as before) when ``--num-gpus-per-client`` is given."""
    layout = simulation_layout(settings, plan, per_client_gpus)
    return layout.per_node, layout.why


def simulation_layout(
    settings: Settings, plan: RayPlan, per_client_gpus: bool = False
) -> NodeLayout:
    """The :class:`~mmfl_flwr.nodes.NodeLayout` of the simulation engine's virtual
    nodes for ``plan`` (see :func:`resolve_clients_per_node`)."""
    return NodeLayout.for_engine(
        settings.num_clients,
        settings.clients_per_node_count(),
        "simulation",
        slots=plan.slots,
        per_client_gpus=per_client_gpus,
        unit="GPU share" if plan.num_gpus_per_client > 0 else "CPU",
    )


def federation_config(
    num_supernodes: int,
    plan: RayPlan,
    num_cpus: int | None = None,
    verbose: bool = False,
    cpus_per_node: int = 1,
) -> tuple[str, dict[str, str]]:
    """``flwr run``'s ``--federation-config`` for ``plan`` and the environment
    variables the SuperLink needs for it (``RAY_ADDRESS`` for a cluster).

    Flower 1.42's ``SimulationConfig`` (``flwr/proto/federation_config_pb2.py``,
    read by ``_run_simulation_settings`` in ``flwr/simulation/app.py``) has
    ``client-resources-num-cpus``/``-num-gpus`` and ``init-args-num-cpus``/
    ``-num-gpus``/``-logging-level``/``-log-to-driver``, and no key for a Ray
    address: ``RayBackend.init_ray`` calls ``ray.init(**init_args)``, and Ray then
    reads ``RAY_ADDRESS``. ``init-args-num-cpus`` is left out for a cluster (Ray
    refuses ``num_cpus`` when it joins one). ``cpus_per_node`` is each
    ClientApp actor's CPUs (Ray sets its ``OMP_NUM_THREADS``, torch's threads).
    """
    keys = [
        f"num-supernodes={num_supernodes}",
        f"client-resources-num-cpus={max(1, int(cpus_per_node))}",
        "init-args-logging-level='ERROR'",
        f"init-args-log-to-driver={'true' if verbose else 'false'}",
    ]
    if plan.num_gpus_per_client > 0:
        keys.append(f"client-resources-num-gpus={plan.num_gpus_per_client!r}")
    if plan.address:
        return " ".join(keys), {"RAY_ADDRESS": plan.address}
    keys.append(f"init-args-num-cpus={int(num_cpus or os.cpu_count() or 1)}")
    return " ".join(keys), {}


def run_on_superlink(
    settings: Settings,
    num_cpus: int | None = None,
    verbose: bool = False,
    timeout: float | None = None,
    num_gpus_per_client: float = 0.0,
    ray_address: str | None = None,
    num_gpus_per_node: float | None = None,
) -> Path:
    """Run ``settings`` on Flower's simulation runtime through a private
    SuperLink (see the module docstring); returns the run's output folder.

    ``num_gpus_per_client`` is each ClientApp's share of a GPU (0.25: four clients
    per GPU; 0: CPUs only); ``ray_address`` joins an existing Ray cluster instead
    of starting Ray here (default: ``RAY_ADDRESS`` of the environment, if set).
    :func:`plan_ray` checks both first and raises ValueError (one line).
    The federation's clients are hosted ``clients-per-node`` per virtual node
    (:func:`resolve_clients_per_node`); ``num_gpus_per_node`` is each such
    node's GPU share.

    Raises :class:`SimulationError` with a one-line reason when the run does not
    finish as ``finished:completed``.
    """
    plan = plan_ray(num_gpus_per_client, ray_address, num_cpus, num_gpus_per_node)
    k, num_nodes, cpus_per_node = _nodes(settings, plan, bool(num_gpus_per_client))
    work = Path(tempfile.mkdtemp(prefix="mmfl-run-"))
    out = Path(settings.output_dir or work / "outputs").resolve()
    port = _free_port()
    app = write_app(work, launched_run_config(settings, out, k), port)
    federation, ray_env = federation_config(num_nodes, plan, num_cpus, verbose, cpus_per_node)
    env = superlink_env(work, ray_env, verbose, local=plan.address is None)
    if plan.address or plan.num_gpus_per_client > 0:
        ignored = " (--num-cpus does not apply to a cluster)" if plan.address and num_cpus else ""
        print(f"[mmfl] {plan.describe()}{ignored}", flush=True)
    link_log = work / "superlink.log"
    link = _start_superlink(port, env, work, link_log)
    stream: subprocess.Popen[str] | None = None
    try:
        _wait_healthy(port, link, link_log, timeout=60)
        flwr = _exe("flwr")
        # one Flower CLI process submits the app and streams its log (each
        # ``flwr`` process costs 2-4 s of CPU to start on 2 cores)
        stream = subprocess.Popen(
            [flwr, "run", str(app), CONNECTION, "--stream", "--federation-config", federation],
            env=env,
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        _follow_to_the_end(stream, flwr, env, work, verbose, timeout)
    finally:
        if stream is not None and stream.poll() is None:  # interrupted: not left behind
            stream.kill()
            stream.wait(timeout=30)
        _stop(link)
        remove_run_files(work, verbose)
    return out


def _nodes(settings: Settings, plan: RayPlan, per_client_gpus: bool) -> tuple[int, int, int]:
    """``(K, nodes, CPUs per node)`` of the run's virtual nodes, said on the
    console where a node hosts more than one client."""
    layout = simulation_layout(settings, plan, per_client_gpus=per_client_gpus)
    if settings.clients_per_node_count() is None:
        # the run config keeps "auto" as typed (config.json, resume, mmfl compare): each
        # node then hosts ceil(N / num-partitions) clients, num-partitions being the
        # virtual nodes started here, which is this K or spreads them evenly
        layout = layout.spread_evenly()
    k, why, num_nodes = layout.per_node, layout.why, layout.num_nodes
    cpus_per_node = 1
    if plan.address is None and plan.num_gpus_per_client == 0:
        # the CPUs left idle by fewer nodes than CPUs go to the nodes' torch threads
        cpus_per_node = max(1, int(sum(c for c, _ in plan.nodes)) // num_nodes)
    if k > 1:
        print(
            f"[mmfl] {settings.num_clients} clients on {num_nodes} Flower node"
            f"{'s' if num_nodes != 1 else ''} of up to {k} ({why}; {cpus_per_node} "
            f"CPU{'s' if cpus_per_node != 1 else ''} each)",
            flush=True,
        )
    return k, num_nodes, cpus_per_node


def _start_superlink(
    port: int, env: dict[str, str], work: Path, link_log: Path
) -> subprocess.Popen[bytes]:
    """Start ``flower-superlink --simulation`` on ``port`` of 127.0.0.1 under its
    supervisor (:mod:`.supervise`), its output to ``link_log``."""
    with open(link_log, "wb") as log_f:
        # in a session of its own: a Ctrl-C or kill of this process group does not
        # reach the supervisor, which then ends the SuperLink's whole tree
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mmfl_flwr.flower_app.supervise",
                "--",
                _exe("flower-superlink"),
                "--insecure",
                "--simulation",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--database",
                ":flwr-in-memory:",
            ],
            env=env,
            cwd=work,
            stdout=log_f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _follow_to_the_end(
    stream: subprocess.Popen[str],
    flwr: str,
    env: dict[str, str],
    work: Path,
    verbose: bool,
    timeout: float | None,
) -> None:
    """Show the log ``flwr run --stream`` prints until it ends; a
    :class:`SimulationError` when no run started (within :data:`SUBMIT_TIMEOUT`)
    or the run did not end as ``finished:completed``."""
    assert stream.stdout is not None
    # submitting is limited as a plain ``flwr run`` call was (SUBMIT_TIMEOUT)
    fired: list[bool] = []

    def on_timeout() -> None:
        fired.append(True)
        stream.kill()

    guard = threading.Timer(SUBMIT_TIMEOUT, on_timeout)
    guard.daemon = True
    guard.start()
    try:
        run_id, finished, before = follow_run_log(
            stream.stdout, verbose, timeout, on_started=guard.cancel
        )
    finally:
        guard.cancel()
    stream.wait(timeout=60)
    if not run_id:
        reason = (
            f"no run after {SUBMIT_TIMEOUT:.0f} s"
            if fired
            else flwr_reason(before) or f"exit code {stream.returncode}"
        )
        raise SimulationError(f"flwr run did not start the run: {reason}")
    if not finished:  # the ServerApp's last line did not come: ask Flower
        status, details = _status(flwr, run_id, env, work)
        if status != "finished:completed":
            raise SimulationError(
                f"the run ended as {status!r} ({details}); run with --verbose to see "
                f"Flower's and Ray's logs (SuperLink: {_last_line(work / 'superlink.log')})"
            )
