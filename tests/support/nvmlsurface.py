"""What gpufeed asks of the NVML binding, read from its source: every name the backend uses on the NVML module
and every call with the number of arguments it passes. The binding conformance test checks them against the
installed ``pynvml``; the fault tests use them to mark every call unsupported."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The only code that talks to NVML (docs/architecture.md): the backend and what it is built from.
NVML_SOURCES = (*sorted((ROOT / "exporter" / "gpu").glob("*.py")), ROOT / "exporter" / "collectors" / "gpu.py")
# A name the binding defines: functions nvmlXxx, constants NVML_*/nvmlEventType*/..., structs c_nvml*.
NAME = re.compile(r"^(nvml[A-Z]\w*|NVML\w*|c_nvml\w+|struct_c_nvml\w+)$")
# Helpers of the backend that call their function argument with the arguments after it.
CALLERS = {"_timed": 1, "_opt": 2}


@dataclass(frozen=True)
class Use:
    """One use of a binding name in gpufeed's source: where, and the positional arity of the call (None when
    the name is not called there, or called with ``*args``)."""

    name: str
    file: str
    line: int
    arity: int | None


def _is_module(node: ast.expr) -> bool:
    """``nvml`` or ``self._nvml`` / ``x._nvml``: the injected NVML module."""
    return (isinstance(node, ast.Name) and node.id == "nvml") or (
        isinstance(node, ast.Attribute) and node.attr == "_nvml")


def _binding_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and _is_module(node.value) and NAME.match(node.attr):
        return node.attr
    return None


def _partial_args(call: ast.Call) -> tuple[str, int] | None:
    """``functools.partial(nvml.f, a, b)``: (f, 2)."""
    fn = call.func
    partial = (isinstance(fn, ast.Attribute) and fn.attr == "partial") or (isinstance(fn, ast.Name)
                                                                           and fn.id == "partial")
    if partial and call.args and (name := _binding_attr(call.args[0])) is not None:
        return name, len(call.args) - 1
    return None


def uses_in(source: str, file: str = "<source>") -> list[Use]:
    """Every binding name ``source`` uses, with the arity of each call it can see."""
    tree = ast.parse(source)
    out: list[Use] = []
    called: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if (name := _binding_attr(node.func)) is not None and not any(isinstance(a, ast.Starred) for a in node.args):
            out.append(Use(name, file, node.lineno, len(node.args)))
            called.add(id(node.func))
        fn = node.func
        helper = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        if helper in CALLERS and len(node.args) > CALLERS[helper]:
            target = node.args[CALLERS[helper]]
            rest = node.args[CALLERS[helper] + 1:]
            if (name := _binding_attr(target)) is not None and not any(isinstance(a, ast.Starred) for a in rest):
                out.append(Use(name, file, node.lineno, len(rest)))
                called.add(id(target))
        if (p := _partial_args(node)) is not None:
            # A partial is completed by its caller with one more argument (the GPM sample).
            out.append(Use(p[0], file, node.lineno, p[1] + 1))
            called.add(id(node.args[0]))
    for node in ast.walk(tree):
        if (name := _binding_attr(node)) is not None and id(node) not in called:
            out.append(Use(name, file, node.lineno, None))  # type: ignore[attr-defined]
        # Names given as strings: getattr(nvml, "nvmlX"), the call names of _opt/_timed, PROCESS_CALLS.
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"nvml[A-Z]\w+", node.value):
            out.append(Use(node.value, file, node.lineno, None))
    return out


def backend_uses(paths: Iterable[Path] = NVML_SOURCES) -> list[Use]:
    """Every binding name gpufeed's NVML code uses."""
    return [u for p in paths for u in uses_in(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]


def backend_functions() -> list[str]:
    """The binding functions gpufeed calls, sorted."""
    return sorted({u.name for u in backend_uses() if u.name.startswith("nvml") and u.name[4].isupper()
                   and not u.name.startswith("nvmlEventType") and not u.name.startswith("nvmlClocks")})


def problems(uses: Iterable[Use], binding: Any) -> Iterator[str]:
    """Each use that the installed ``binding`` does not support: a missing name, or a call whose arity its
    signature rejects."""
    for u in uses:
        where = f"{u.file}:{u.line}"
        if not hasattr(binding, u.name):
            yield f"{where}: {u.name} is not defined by the installed binding"
            continue
        obj = getattr(binding, u.name)
        if u.arity is None or not callable(obj) or inspect.isclass(obj):
            continue
        try:
            inspect.signature(obj).bind(*([None] * u.arity))
        except TypeError as e:
            yield f"{where}: {u.name} called with {u.arity} argument(s): {e} (binding: {inspect.signature(obj)})"
