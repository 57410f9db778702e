"""The options of the engine a run goes to, checked once: :class:`EngineOptions`.

``mmfl run`` (flags) and :func:`mmfl_flwr.runner.run` (keywords) take the same
options and refuse the same values with the same rule, each naming them in its own
words (``--vector-chunk`` / ``vector_chunk``). What each engine takes:

====================  ===================================================
option                engine
====================  ===================================================
``vector_chunk``      ``vectorized``: clients per batched training call
``threads``           ``vectorized``: torch threads (``auto`` or a number)
``num_gpus_per_*``,   ``simulation``: GPU shares and a Ray cluster
``ray_address``       (their values are checked against Ray itself by
                      :func:`mmfl_flwr.flower_app.launch.plan_ray`)
====================  ===================================================

The node layout (``clients-per-node``) is a setting of the run, read by
:class:`mmfl_flwr.nodes.NodeLayout`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

#: The engines a run can go to (:func:`mmfl_flwr.runner.run`'s ``engine``).
ENGINES = ("simulation", "inprocess", "vectorized")
#: The options only Flower's simulation engine (Ray) takes.
RAY_OPTIONS = ("num_gpus_per_client", "num_gpus_per_node", "ray_address")


def check_chunk(chunk: object, name: str = "chunk") -> int | None:
    """``chunk`` as a whole number >= 1 (None stays None); a ValueError naming
    ``name`` otherwise."""
    if chunk is None:
        return None
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
        raise ValueError(f"{name} must be >= 1, got {chunk}")
    return int(chunk)


@dataclass(frozen=True)
class EngineOptions:
    """Where a run goes and with which engine options (None: not given).

    Attributes
    ----------
    engine : str
        One of :data:`ENGINES`.
    vector_chunk : int, optional
        Clients per batched training call of the vectorized engine.
    threads : str or int, optional
        The vectorized engine's torch threads: ``"auto"`` or a whole number >= 1.
    num_gpus_per_client, num_gpus_per_node : float, optional
        GPU share of each ClientApp / each multi-client node (simulation).
    ray_address : str, optional
        A Ray cluster to join (simulation).
    """

    engine: str = "simulation"
    vector_chunk: int | None = None
    threads: str | int | None = None
    num_gpus_per_client: float | None = None
    num_gpus_per_node: float | None = None
    ray_address: str | None = None

    def ray_options(self) -> dict[str, float | str]:
        """The Ray options given, as keywords of the simulation launcher."""
        out: dict[str, float | str] = {}
        for name in RAY_OPTIONS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def check(self, flags: bool = False) -> None:
        """Raise ValueError (one line) for an unknown engine, an option given to an
        engine that does not take it, a ``vector_chunk`` below 1 or ``threads``
        that are neither ``auto`` nor a whole number >= 1. ``flags``: name them
        as ``mmfl run``'s flags, else as keywords."""
        from mmfl_flwr.client.threads import parse_threads

        def name(option: str) -> str:
            return f"--{option.replace('_', '-')}" if flags else option

        def on(engine: str) -> str:
            return f"--engine {engine}" if flags else f"engine={engine!r}"

        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose from {', '.join(ENGINES)}")
        if self.vector_chunk is not None and self.engine != "vectorized":
            raise ValueError(
                f"{name('vector_chunk')} applies to {on('vectorized')} only, "
                f"not to {on(self.engine)}"
            )
        check_chunk(self.vector_chunk, name("vector_chunk"))
        if self.threads is not None:
            if self.engine != "vectorized":
                raise ValueError(
                    f"{name('threads')} applies to {on('vectorized')} only, not to "
                    f"{on(self.engine)} (a simulation node's threads are its CPUs)"
                )
            parse_threads(self.threads)
        for option in self.ray_options():
            if self.engine != "simulation":
                raise ValueError(
                    f"{name(option)} applies to {on('simulation')} (Flower's Ray "
                    f"engine) only, not to {on(self.engine)}"
                )
