"""The per-client and the batched client paths share one definition of each
helper (issue 58): one weight-key check, one DP clip, one plain-TorchTrainer
test, one packed-row reader, one loss/accuracy pass and one place that sets
torch's threads. The first tests read the source (``ast``) and fail when one of
these is written a second time; the others pin what each shared helper does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from mmfl_flwr.client import rows as R
from mmfl_flwr.client import threads as TH
from mmfl_flwr.client import vectorized as V
from mmfl_flwr.client.trainer import (
    TorchTrainer,
    initial_weights,
    load_arrays,
    packed_rows,
    torch_trainer_override,
)
from mmfl_flwr.client.weights import check_weight_keys, clip_to_norm
from mmfl_flwr.core.clipping import update_norm
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.models import make_model

PACKAGE = Path(__file__).resolve().parents[2] / "mmfl_flwr"
CLIENT = PACKAGE / "client"

#: each shared helper: the module that defines it, once in the package
HELPERS = {
    "check_weight_keys": "client/weights.py",
    "clip_to_norm": "client/weights.py",
    "trainable_keys": "client/weights.py",
    "torch_trainer_override": "client/trainer.py",
    "one_run": "client/rows.py",
    "packed": "client/rows.py",
    "joined": "client/rows.py",
    "forward_sums": "client/rows.py",
    "loss_accuracy": "client/rows.py",
    "set_torch_threads": "client/threads.py",
    "apply_engine_threads": "client/threads.py",
}


def _modules(root: Path) -> dict[str, ast.Module]:
    return {
        str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p))
        for p in sorted(root.rglob("*.py"))
    }


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _innermost(tree: ast.Module, node: ast.AST) -> str:
    """The name of the innermost function holding ``node`` ("" at module level)."""
    best, size = "", None
    for fn in _functions(tree):
        if fn.lineno <= node.lineno <= (fn.end_lineno or fn.lineno):  # type: ignore[attr-defined]
            span = (fn.end_lineno or fn.lineno) - fn.lineno
            if size is None or span < size:
                best, size = fn.name, span
    return best


def _called(node: ast.AST) -> str:
    """The name a call node calls (``f(...)``, ``x.f(...)``), else ""."""
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute):
            return f.attr
    return ""


def _is_torch_trainer_method(node: ast.AST) -> bool:
    """``TorchTrainer.<name>`` or ``getattr(TorchTrainer, ...)``."""
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "TorchTrainer"
    return (
        _called(node) == "getattr"
        and isinstance(node, ast.Call)
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "TorchTrainer"
    )


def _sites(root: Path, match) -> set[tuple[str, str]]:
    """(module, innermost function) of every node of the modules under ``root``
    for which ``match(node)`` holds."""
    return {
        (mod, _innermost(tree, n))
        for mod, tree in _modules(root).items()
        for n in ast.walk(tree)
        if match(n)
    }


def test_each_shared_helper_is_defined_once_in_the_package():
    defined: dict[str, list[str]] = {}
    for mod, tree in _modules(PACKAGE).items():
        for fn in tree.body:  # module-level functions (a trainer's methods are its own)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in HELPERS:
                defined.setdefault(fn.name, []).append(mod)
    assert defined == {name: [mod] for name, mod in HELPERS.items()}


def test_no_two_client_modules_define_a_function_of_one_name():
    seen: dict[str, list[str]] = {}
    for mod, tree in _modules(CLIENT).items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                seen.setdefault(node.name, []).append(mod)
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_each_concept_is_computed_in_its_helper_only():
    weight_check = _sites(
        PACKAGE,
        lambda n: (
            isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and "weight keys mismatch" in n.value
        ),
    )
    assert weight_check == {("client/weights.py", "check_weight_keys")}
    # the DP clip of a trained update, on the client side
    assert _sites(CLIENT, lambda n: _called(n) == "clip_update") == {
        ("client/weights.py", "clip_to_norm")
    }
    # comparing a class's methods with TorchTrainer's: the plain-trainer test
    assert _sites(
        CLIENT,
        lambda n: (
            isinstance(n, ast.Compare)
            and any(isinstance(op, (ast.Is, ast.IsNot)) for op in n.ops)
            and any(_is_torch_trainer_method(side) for side in [n.left, *n.comparators])
        ),
    ) == {("client/trainer.py", "torch_trainer_override")}
    # accuracy is counted in the one loss/accuracy pass
    assert _sites(CLIENT, lambda n: _called(n) == "argmax") == {("client/rows.py", "forward_sums")}
    # torch's threads are set in one function
    assert _sites(
        PACKAGE, lambda n: _called(n) in ("set_num_threads", "set_num_interop_threads")
    ) == {("client/threads.py", "set_torch_threads")}


def test_the_readers_of_packed_rows_go_through_one_run():
    calls = {
        (mod, fn.name, _called(n))
        for mod, tree in _modules(CLIENT).items()
        for fn in _functions(tree)
        for n in ast.walk(fn)
        if _called(n)
    }
    assert ("client/rows.py", "packed", "one_run") in calls
    assert ("client/rows.py", "joined", "one_run") in calls
    assert ("client/trainer.py", "packed_rows", "packed") in calls
    assert ("client/vectorized.py", "_concat", "joined") in calls
    assert ("client/vectorized.py", "_forward_rows", "forward_sums") in calls
    assert ("client/shard.py", "_run_group", "clip_to_norm") in calls
    assert ("client/contract.py", "clip_for_config", "clip_to_norm") in calls
    assert ("client/shard.py", "_why_not_batched", "torch_trainer_override") in calls
    assert ("runner.py", "_run_on_inprocess_grid", "apply_engine_threads") in {
        (mod, fn.name, _called(n))
        for mod, tree in _modules(PACKAGE).items()
        if mod == "runner.py"
        for fn in _functions(tree)
        for n in ast.walk(fn)
    }


def test_client_functions_and_modules_keep_the_size_convention():
    long_fns = [
        (mod, fn.name, (fn.end_lineno or 0) - fn.lineno + 1)
        for mod, tree in _modules(CLIENT).items()
        for fn in _functions(tree)
        if (fn.end_lineno or 0) - fn.lineno + 1 > 100
    ]
    assert long_fns == []
    for p in CLIENT.rglob("*.py"):
        text = p.read_text()
        if len(text.splitlines()) > 600:
            doc = ast.get_docstring(ast.parse(text)) or ""
            assert any(par.startswith("Why one module:") for par in doc.split("\n\n")), p


# ----------------------------------------------------------- the helpers
def _net_shapes():
    model = make_model("synthetic")
    return model, {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_the_weight_key_check_names_missing_extra_and_misshapen_entries():
    model, shapes = _net_shapes()
    good = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    check_weight_keys(shapes, good)
    first = next(iter(good))
    bad_keys = {**{k: v for k, v in good.items() if k != first}, "zzz": np.zeros(1)}
    misshapen = {**good, first: np.zeros((*good[first].shape, 2), np.float32)}
    vm = V.VectorModel(lambda: make_model("synthetic"), torch.device("cpu"))
    for load in (lambda w: load_arrays(make_model("synthetic"), w), vm.tensors):
        with pytest.raises(KeyError, match=rf"missing \['{first}'\], extra \['zzz'\]"):
            load(bad_keys)
        with pytest.raises(ValueError, match=f"shape mismatch for {first}"):
            load(misshapen)


class _Declared:
    trainable_keys = ["w"]


def test_the_dp_clip_clips_the_declared_or_else_the_floating_entries():
    received = {"w": np.zeros(3, np.float32), "s": np.zeros(3, np.float32), "i": np.zeros(2, int)}
    new = {"w": np.full(3, 4.0, np.float32), "s": np.full(3, 4.0, np.float32), "i": np.ones(2, int)}
    out = clip_to_norm(new, received, _Declared(), 1.0)
    assert update_norm(out, received, ["w"]) <= 1.0
    np.testing.assert_array_equal(out["s"], new["s"])  # state: not part of the update
    np.testing.assert_array_equal(new["w"], np.full(3, 4.0))  # the input is left as it was
    out = clip_to_norm(new, received, object(), 1.0)  # nothing declared: the float entries
    assert update_norm(out, received, ["w", "s"]) <= 1.0 and out["s"][0] < 4.0
    np.testing.assert_array_equal(out["i"], new["i"])
    assert clip_to_norm(new, received, object(), 100.0)["w"][0] == 4.0  # within the norm


def _data(n: int, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    return Dataset(rng.normal(size=(n, 60)).astype(np.float32), rng.integers(0, 5, size=n))


def test_the_plain_trainer_test_names_the_first_replaced_method():
    class OwnRows(TorchTrainer):
        def eval_tensors(self):
            return super().eval_tensors()

    d = _data(6)
    fn = lambda: make_model("synthetic")  # noqa: E731
    own = OwnRows(fn, d, d, 4)
    assert torch_trainer_override(own) == ""  # the batched SGD applies
    assert torch_trainer_override(own, ("train_tensors", "eval_tensors")) == "eval_tensors"
    assert torch_trainer_override(object(), ("train",)) == ""
    assert packed_rows([own], "eval") is None  # its own rows: not read as packed


def test_one_run_reads_spans_one_after_another_in_one_owner():
    assert R.one_run([("a", 3, 2), ("a", 5, 4), ("a", 9, 1)]) == (3, 10)
    assert R.one_run([("a", 3, 2)]) == (3, 5)
    assert R.one_run([]) is None
    assert R.one_run([("a", 3, 2), ("a", 6, 1)]) is None  # a gap
    assert R.one_run([("a", 3, 2), ("b", 5, 1)]) is None  # another owner
    assert R.one_run([("a", 5, 2), ("a", 3, 2)]) is None  # another order


def test_joined_views_consecutive_rows_and_copies_the_others():
    whole = torch.arange(24.0).reshape(8, 3)
    parts = [whole[1:3], whole[3:4], whole[4:7]]
    view = R.joined(parts)
    assert view.data_ptr() == whole[1].data_ptr()  # no copy
    assert torch.equal(view, torch.cat(parts))
    for others in ([whole[4:7], whole[1:3]], [whole[1:3], whole[4:5]], [whole[:, :2]]):
        out = R.joined(others)
        assert torch.equal(out, torch.cat(others))
        assert out.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()


def test_the_loss_accuracy_pass_sums_per_client():
    torch.manual_seed(0)
    model = make_model("synthetic")
    x = torch.randn(11, 60)
    y = torch.randint(0, 5, (11,))
    with torch.no_grad():
        logits = model(x)
    per = F.cross_entropy(logits, y, reduction="none").double()
    hit = (logits.argmax(dim=1) == y).double()
    owner = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2])
    loss_sum, correct = R.forward_sums(model, x, y, 4, owner, 3)
    for c in range(3):
        assert float(loss_sum[c]) == pytest.approx(float(per[owner == c].sum()), rel=1e-12)
        assert float(correct[c]) == float(hit[owner == c].sum())
    one_loss, one_correct = R.forward_sums(model, x, y, 4)  # one client: batch sums
    want = sum(
        float(F.cross_entropy(logits[s : s + 4], y[s : s + 4], reduction="sum"))
        for s in range(0, 11, 4)
    )
    assert float(one_loss[0]) == want and float(one_correct[0]) == float(hit.sum())
    loss, acc = R.loss_accuracy(model, x, y, 4)
    assert loss == want / 11 and acc == float(hit.sum()) / 11


def test_a_trainers_loss_and_accuracy_come_from_the_shared_pass(monkeypatch):
    d = _data(9)
    fn = lambda: make_model("synthetic")  # noqa: E731
    tr = TorchTrainer(fn, d, d, 4)
    w = initial_weights(fn, 0)
    seen = []
    real = R.forward_sums
    monkeypatch.setattr(R, "forward_sums", lambda *a, **k: seen.append(a[3]) or real(*a, **k))
    loss, acc, n = tr.evaluate(w)
    assert seen == [4] and n == 9 and 0.0 <= acc <= 1.0 and loss > 0


def test_engine_threads_are_set_in_one_place(monkeypatch):
    before = torch.get_num_threads()
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(n))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    budget = TH.cpu_budget()
    try:
        assert TH.apply_engine_threads("inprocess", "auto") == 1
        assert TH.apply_engine_threads("vectorized", 2) == 2
        assert TH.apply_engine_threads("vectorized", "auto") == budget
        assert TH.apply_engine_threads("vectorized", None) == budget
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert TH.apply_engine_threads("vectorized", "auto") == 1
        with pytest.raises(ValueError, match="--threads"):
            TH.apply_engine_threads("vectorized", "0")
        assert seen == [1, 2, budget, budget, 1]
        assert TH.ThreadChooser(3).apply() == 3 and seen[-1] == 3
    finally:
        monkeypatch.undo()
        torch.set_num_threads(before)
