"""Mutation testing of ``rlpost.core``'s registry entries and the preset's loss assembly.

Each mutant is one small change to one function: a sign flipped (``a - b`` -> ``a + b``,
``-x`` -> ``x``), a normaliser dropped (``a / b`` -> ``a``), a scale changed
(``a * b`` -> ``a / b``), a comparison or clip bound swapped (``<`` <-> ``<=``,
``min`` <-> ``max``, ``clamp(x, lo, hi)`` -> ``clamp(x, -hi, hi)``), a constant nudged
(``1`` -> ``2``). A mutant is *killed* when a test that runs the mutated function fails.

How it runs, in one process (torch is imported once):

1. the target functions: every entry of every core registry (``rlpost.core.REGISTRIES``)
   and the module-level functions of the module defining it, plus the preset loss
   (``rlpost/core/presets/base.py``);
2. a coverage pass runs the core test suite once under ``sys.monitoring`` and records,
   for each test, which target functions it entered;
3. per mutant, the mutated module is compiled from its AST (line numbers kept) and the
   live function's ``__code__`` is replaced, so every reference (registries, presets,
   imports) runs the mutant; the tests that entered that function run (``pytest -x``,
   in process); then the code is restored.

    uv run --frozen python tools/mutate_core.py --out docs/results/mutation_core.json
    uv run --frozen python tools/mutate_core.py --registry kl --max-per-function 3

Equivalent mutants (a change that cannot alter any result, e.g. ``clamp_min(0)`` of a
value that is never negative) survive by nature; the report lists every survivor so
that each is either given a test or named as equivalent.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib
import inspect
import io
import sys
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "packages" / "rlpost-core" / "tests"
EXTRA = ("rlpost.core.presets.base",)  # the preset's loss assembly (KL, entropy, aux terms)
UNCAPPED = ("Recipe.policy_loss",)  # every site of the loss assembly, whatever the cap

#: Mutants that cannot change any output or gradient, with the reason: ``(target, site
#: index, before, after) -> why`` (the site index tells apart equal text at two sites; a
#: changed function no longer matches and its mutant runs again). Reported as
#: ``equivalent`` and left out of the kill rate.
EQUIVALENT: dict[tuple[str, int, str, str], str] = {
    ("rlpost.core.presets.base:Recipe.policy_loss", 5, "1.0", "3.0"): (
        "the w_rl == 1.0 fast path: the other branch computes 1.0 * loss, the same tensor"
    ),
    ("rlpost.core.regularizers.cpo:_kth_largest", 3, "1", "3"): (
        "hi = (1 << 31) - 3 only drops the bit patterns 0x7FFFFFFE / 0x7FFFFFFF, NaNs that "
        "non-negative squared movements never hold"
    ),
    (
        "rlpost.core.advantages.best_of_n:gaussian_best_of_n_gain",
        10,
        "z.to(torch.float64) > grid[-1]",
        "z.to(torch.float64) >= grid[-1]",
    ): (
        "only z = 8 exactly, where the table's last value and the asymptote agree (h(8) = 8) "
        "up to float64 rounding of the interpolation"
    ),
    ("rlpost.core.advantages.best_of_n:tea", 0, "sigma > 0", "sigma >= 0"): (
        "sigma = 0 means every reward equals the mean: z = 0 either way, and g is zeroed next"
    ),
    ("rlpost.core.advantages.best_of_n:tea", 3, "sigma > 0", "sigma >= 0"): (
        "with sigma = 0, g = 0 * h_N(0) = 0, the value of the other branch"
    ),
    ("rlpost.core.advantages.classic:rloo", 0, "s.count > 1", "s.count >= 1"): (
        "a singleton group's 1/1 * (r - mean) is exactly 0, the other branch's value"
    ),
    ("rlpost.core.advantages.entropy:fade", 9, "1", "3"): (
        "pads the group table with inactive groups that no response indexes"
    ),
    (
        "rlpost.core.advantages.stages:stage_grpo",
        0,
        "(p.outcome_weight * outcome[:, None] + p.stage_weight * turn_z) * exists.float()",
        "(p.outcome_weight * outcome[:, None] + p.stage_weight * turn_z) / exists.float()",
    ): (
        "the inf / NaN at absent turns is never read: token advantages take existing turns "
        "only (where(valid, ...)), and advantages are not differentiated"
    ),
    (
        "rlpost.core.advantages.turns:turn_group_keys",
        0,
        "gid[:, None] * U + torch.arange(U, device=device)",
        "gid[:, None] * U - torch.arange(U, device=device)",
    ): ("still one distinct key per (prompt, turn); keys are only compared for equality"),
    ("rlpost.core.objectives.offpolicy:implicit_pessimism", 3, "A > 0", "A >= 0"): (
        "at A = 0 both branches give value 0 and gradient 0"
    ),
    ("rlpost.core.objectives.offpolicy:up", 7, "A > 0", "A >= 0"): (
        "at A = 0 both branches give value 0 and gradient 0"
    ),
    ("rlpost.core.objectives.offpolicy:normalized_ess_log", 0, "n > 0", "n >= 0"): (
        "at n = 0 the ESS is exp(-inf + inf) = NaN, which the isfinite check already refuses"
    ),
    ("rlpost.core.objectives.offpolicy:ess_adaptive", 6, "m > 0", "m >= 0"): (
        "a masked token's finite rho is multiplied by its zero mask in the loss and the metric"
    ),
    (
        "rlpost.core.ratios.divergence:predictive_divergence_mask",
        0,
        "max(1, CHUNK_ELEMENTS // max(1, T * K))",
        "min(1, CHUNK_ELEMENTS // max(1, T * K))",
    ): ("only the row-chunk size changes; the per-row mask is the same for any chunk size"),
    (
        "rlpost.core.ratios.corrections:_call_seed",
        0,
        "h * 1000003 + int((c.flatten() * (ramp + 1)).sum().item() * 1000000.0 % 2 ** 31)",
        "h * 1000003 - int((c.flatten() * (ramp + 1)).sum().item() * 1000000.0 % 2 ** 31)",
    ): (
        "another deterministic, input-dependent per-call seed: equivalent for the contract "
        "(the draws differ; no property depends on which seed)"
    ),
    (
        "rlpost.core.ratios.corrections:_call_seed",
        8,
        "c.flatten() * (ramp + 1)",
        "c.flatten() / (ramp + 1)",
    ): ("another deterministic, input-dependent per-call seed (as above)"),
}


# ------------------------------------------------------------------------ targets


@dataclass
class Target:
    module: str
    qualname: str
    registry: str
    fn: types.FunctionType
    path: str
    first: int


def _unwrap(obj):
    while hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    return obj if isinstance(obj, types.FunctionType) else None


def _module_functions(mod) -> list[types.FunctionType]:
    """Functions and methods defined in ``mod`` (not imported into it)."""
    out = []
    for obj in vars(mod).values():
        fn = _unwrap(obj)
        if fn is not None and fn.__module__ == mod.__name__:
            out.append(fn)
        elif inspect.isclass(obj) and obj.__module__ == mod.__name__:
            for v in vars(obj).values():
                f = _unwrap(v)
                if f is not None and f.__module__ == mod.__name__:
                    out.append(f)
    return out


def targets(registry_filter: str | None) -> list[Target]:
    from rlpost.core import REGISTRIES

    by_module: dict[str, str] = {}
    for kind, reg in REGISTRIES.items():
        if registry_filter and kind != registry_filter:
            continue
        for name in reg.names():
            fn = _unwrap(reg.get(name).fn)
            if fn is not None:
                by_module.setdefault(fn.__module__, kind)
    if not registry_filter or registry_filter == "presets":
        for m in EXTRA:
            by_module.setdefault(m, "presets")
    out = []
    for modname, kind in sorted(by_module.items()):
        mod = importlib.import_module(modname)
        for fn in _module_functions(mod):
            if fn.__name__ == "__post_init__":  # parameter validation, not the math
                continue
            try:
                _, first = inspect.getsourcelines(fn)
            except (OSError, TypeError):
                continue
            out.append(Target(modname, fn.__qualname__, kind, fn, inspect.getsourcefile(fn), first))
    return out


# ------------------------------------------------------------------------ mutants

_BINOP = {ast.Sub: ast.Add, ast.Add: ast.Sub, ast.Mult: ast.Div, ast.Div: ast.Mult}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_SWAP = {"min": "max", "max": "min", "amin": "amax", "amax": "amin", "clamp_min": "clamp_max",
         "clamp_max": "clamp_min", "minimum": "maximum", "maximum": "minimum"}  # fmt: skip


@dataclass
class Mutant:
    target: str  # module:qualname
    registry: str
    index: int  # the site's index among the function's sites
    line: int
    op: str
    before: str
    after: str
    status: str = "untested"  # killed | survived | equivalent | no-tests | not-compiled
    tests: int = 0
    killed_by: str | None = None
    seconds: float = 0.0
    why: str | None = None  # for an equivalent mutant


def _name_swap(n: ast.Call) -> ast.Call:
    m = copy.deepcopy(n)
    if isinstance(m.func, ast.Attribute):
        m.func.attr = _SWAP[m.func.attr]
    else:
        m.func.id = _SWAP[m.func.id]
    return m


def _widen(n: ast.Call) -> ast.Call:
    m = copy.deepcopy(n)
    m.args[1] = ast.UnaryOp(ast.USub(), copy.deepcopy(n.args[2]))
    return m


def _site(node: ast.AST) -> list[tuple[str, object]]:
    """The mutations of one node: ``(op, apply)``, ``apply(node) -> replacement``."""
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
        new = _BINOP[type(node.op)]
        out = [(f"{type(node.op).__name__}->{new.__name__}",
                lambda n, new=new: ast.BinOp(n.left, new(), n.right))]  # fmt: skip
        if isinstance(node.op, ast.Div):
            out.append(("drop-divisor", lambda n: n.left))
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return [("drop-minus", lambda n: n.operand)]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        new = _CMP[type(node.ops[0])]
        return [(f"{type(node.ops[0]).__name__}->{new.__name__}",
                 lambda n, new=new: ast.Compare(n.left, [new()], n.comparators))]  # fmt: skip
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        out = []
        if name in _SWAP:
            out.append((f"{name}->{_SWAP[name]}", _name_swap))
        if name in ("clamp", "clip") and len(node.args) == 3:
            out.append(("clamp-low->-high", _widen))
        return out
    numeric = isinstance(node, ast.Constant) and type(node.value) in (int, float)
    if numeric and node.value in (0.5, 1, 2):
        v = node.value * 2 + 1
        return [(f"{node.value}->{v}", lambda n, v=v: ast.Constant(v))]
    return []


def _skip(fn: ast.AST) -> set[int]:
    """Nodes inside ``raise`` / ``assert`` / f-strings / docstrings: they only change an
    error or a message."""
    out: set[int] = set()
    for node in ast.walk(fn):
        if isinstance(node, (ast.Raise, ast.Assert, ast.JoinedStr)):
            out.update(id(n) for n in ast.walk(node))
    for s in getattr(fn, "body", [])[:1]:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            out.add(id(s.value))
    for d in getattr(fn, "decorator_list", []):
        out.update(id(n) for n in ast.walk(d))
    args = getattr(fn, "args", None)
    if args is not None:  # default values: a mutated default is a different call
        out.update(id(n) for n in ast.walk(args))
    return out


def sites(fn_node: ast.AST) -> list[tuple[ast.AST, str, object]]:
    skip = _skip(fn_node)
    out = []
    for node in ast.walk(fn_node):
        if id(node) in skip:
            continue
        out.extend((node, op, apply) for op, apply in _site(node))
    return out


def _fn_node(tree: ast.Module, t: Target) -> ast.AST | None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if first == t.first and node.name == t.fn.__name__:
                return node
    return None


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    ast.copy_location(new, old)
    ast.fix_missing_locations(new)
    for parent in ast.walk(tree):
        for fname, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, fname, new)
                return
            if isinstance(value, list):
                for i, v in enumerate(value):
                    if v is old:
                        value[i] = new
                        return
    raise LookupError("site not found")


def _find_code(code: types.CodeType, qualname: str, first: int) -> types.CodeType | None:
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            if c.co_qualname == qualname and c.co_firstlineno == first:
                return c
            found = _find_code(c, qualname, first)
            if found is not None:
                return found
    return None


def plan(t: Target, cap: int) -> list[Mutant]:
    src = Path(t.path).read_text()
    node = _fn_node(ast.parse(src), t)
    if node is None:
        return []
    found = sites(node)
    idx = list(range(len(found)))
    if cap and len(idx) > cap and t.qualname not in UNCAPPED:  # spread, deterministically
        idx = [int(i * len(found) / cap) for i in range(cap)]
    key = f"{t.module}:{t.qualname}"
    out = []
    for i in idx:
        site, op, apply = found[i]
        out.append(Mutant(key, t.registry, i, site.lineno, op, ast.unparse(site),
                          ast.unparse(apply(site))))  # fmt: skip
    return out


def mutant_code(t: Target, m: Mutant) -> types.CodeType:
    """The target function's code with mutant ``m`` applied (compiled from the AST: the
    line numbers are the file's)."""
    tree = ast.parse(Path(t.path).read_text())
    node = _fn_node(tree, t)
    site, _, apply = sites(node)[m.index]
    _replace(tree, site, apply(site))
    code = compile(tree, t.path, "exec")
    found = _find_code(code, t.fn.__code__.co_qualname, t.fn.__code__.co_firstlineno)
    if found is None:
        raise LookupError(f"no code object for {m.target}")
    return found


# ------------------------------------------------------------------------ tests


class _Coverage:
    """Which target functions each test enters (``sys.monitoring`` PY_START)."""

    def __init__(self, codes: dict[types.CodeType, str]):
        self.codes, self.current, self.hits = codes, None, {}

    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        self.hits.setdefault(item.nodeid, set())

    def on_start(self, code, offset):
        key = self.codes.get(code)
        if key is None:
            return sys.monitoring.DISABLE
        if self.current is not None:
            self.hits[self.current].add(key)
        return None


class _Outcome:
    def __init__(self):
        self.failed: str | None = None
        self.ran = 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            self.ran += 1
        if report.failed and self.failed is None:
            self.failed = report.nodeid


PYTEST = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "not slow", "-p", "no:xdist",
          "--rootdir", str(ROOT)]  # fmt: skip


def _pytest(args: list[str], plugin) -> int:
    import pytest

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return pytest.main([*PYTEST, *args], plugins=[plugin])


def coverage(ts: list[Target], files: list[str]) -> dict[str, set[str]]:
    codes = {t.fn.__code__: f"{t.module}:{t.qualname}" for t in ts}
    cov = _Coverage(codes)
    mon = sys.monitoring
    tool = mon.PROFILER_ID
    mon.use_tool_id(tool, "mutate_core")
    mon.register_callback(tool, mon.events.PY_START, cov.on_start)
    mon.set_events(tool, mon.events.PY_START)
    try:
        rc = _pytest(files, cov)
    finally:
        mon.set_events(tool, 0)
        mon.register_callback(tool, mon.events.PY_START, None)
        mon.free_tool_id(tool)
    if rc not in (0, 1):
        raise SystemExit(f"the coverage pass failed to run (pytest exit {rc})")
    by_target: dict[str, set[str]] = {}
    for test, keys in cov.hits.items():
        for k in keys:
            by_target.setdefault(k, set()).add(test)
    return by_target


class _Timeout(Exception):
    pass


def run_mutant(t: Target, m: Mutant, tests: list[str], timeout: float) -> None:
    import signal

    why = EQUIVALENT.get((m.target, m.index, m.before, m.after))
    if why is not None:
        m.status, m.why = "equivalent", why
        return

    try:
        code = mutant_code(t, m)
    except (SyntaxError, LookupError, ValueError):
        m.status = "not-compiled"
        return
    if not tests:
        m.status = "no-tests"
        return
    original = t.fn.__code__
    out = _Outcome()

    def alarm(*_):
        raise _Timeout(f"mutant ran past {timeout} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        t.fn.__code__ = code
        _pytest(["-x", *sorted(tests)], out)
    except _Timeout:
        out.failed = out.failed or "timeout"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        t.fn.__code__ = original
    m.tests = len(tests)
    m.status = "killed" if out.failed else "survived"
    m.killed_by = out.failed


# ------------------------------------------------------------------------ report


def summary(mutants: list[Mutant]) -> list[dict]:
    rows: dict[str, dict] = {}
    for m in mutants:
        r = rows.setdefault(m.registry, {"registry": m.registry, "mutants": 0, "killed": 0,
                                         "survived": 0, "equivalent": 0, "no_tests": 0})  # fmt: skip
        r["mutants"] += 1
        r["equivalent"] += m.status == "equivalent"
        r["killed"] += m.status == "killed"
        r["survived"] += m.status == "survived"
        r["no_tests"] += m.status == "no-tests"
    for r in rows.values():
        tested = r["killed"] + r["survived"]
        r["kill_rate"] = round(r["killed"] / tested, 3) if tested else None
    return sorted(rows.values(), key=lambda r: r["registry"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registry", help="one registry (advantages, kl, ..., presets)")
    ap.add_argument("--function", help="only targets whose qualname contains this")
    ap.add_argument("--max-per-function", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per mutant")
    ap.add_argument("--tests", nargs="*", default=[str(TESTS)], help="test files or dirs")
    ap.add_argument("--out", type=Path, help="write the report JSON here")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per mutant")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    ts = targets(args.registry)
    if args.function:
        ts = [t for t in ts if args.function in t.qualname]
    t0 = time.perf_counter()
    cov = coverage(ts, args.tests)
    print(f"{len(ts)} target functions; coverage pass {time.perf_counter() - t0:.0f} s",
          flush=True)  # fmt: skip
    mutants: list[Mutant] = []
    for t in ts:
        key = f"{t.module}:{t.qualname}"
        for m in plan(t, args.max_per_function):
            t1 = time.perf_counter()
            run_mutant(t, m, sorted(cov.get(key, ())), args.timeout)
            m.seconds = round(time.perf_counter() - t1, 2)
            mutants.append(m)
            if args.verbose:
                print(f"{m.seconds:6.1f}s {m.status:<9} {m.tests:>4} {m.target}:{m.line} {m.op}",
                      flush=True)  # fmt: skip
                continue
            mark = {"killed": ".", "survived": "S", "no-tests": "-", "equivalent": "="}.get(
                m.status, "?"
            )
            print(mark, end="", flush=True)
    print()
    rows = summary(mutants)
    print(f"{'registry':<16}{'mutants':>8}{'killed':>8}{'survived':>9}{'equiv.':>8}"
          f"{'no tests':>9}{'rate':>7}")  # fmt: skip
    for r in rows:
        rate = "-" if r["kill_rate"] is None else f"{r['kill_rate']:.2f}"
        print(f"{r['registry']:<16}{r['mutants']:>8}{r['killed']:>8}{r['survived']:>9}"
              f"{r['equivalent']:>8}{r['no_tests']:>9}{rate:>7}")  # fmt: skip
    for m in mutants:
        if m.status == "survived":
            print(f"  survived  {m.target}:{m.line}  {m.op}: {m.before} -> {m.after}")
    if args.out:
        sys.path.insert(0, str(Path(__file__).parent))
        from benchlib import write_result

        tested = sum(r["killed"] + r["survived"] for r in rows)
        killed = sum(r["killed"] for r in rows)
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        write_result(
            args.out,
            name="mutate_core",
            catalog_ids=[],
            config={**config, "seconds": round(time.perf_counter() - t0, 1)},
            seeds=[],
            rows=[
                *({"part": "registry", **r} for r in rows),
                *({"part": "mutant", **asdict(m)} for m in mutants),
            ],
            headline={
                "metric": "mutants killed / mutants that are not equivalent and have a test",
                "value": killed,
                "baseline": tested,
                "ratio": round(killed / tested, 3) if tested else None,
                "paper": "no paper: a fidelity check of rlpost.core's tests (issue 44)",
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
