"""Which mutants change only a message: the filter mutation/mutmut.toml's [tool.san-mutation] configures.

mutmut mutates string literals ("XX" around them, upper and lower case) and drops or nulls call arguments,
and most string literals in the mutated files are error texts: a mutant that changes one of those changes what
a person reads, not what a provider may do, and no conformance scenario should pin it. Such a mutant is
*message-only* when every difference between it and the original function is one of

* a string literal's text (or the literal replaced by ``None``),
* an f-string or string concatenation replaced by ``None``,
* the last positional argument of a call dropped, when that argument is a string expression,

and that string sits in a message position: an argument of a call named in ``message_calls`` (fnmatch
patterns over the callee's source text, e.g. ``*Error`` or ``problems.append``) or of the exception a ``raise``
builds, an ``assert``'s message, a keyword argument named in ``message_keywords``, a value assigned to a name in
``message_names``, or what a function named in ``message_returns`` returns. A string reaches its position
through f-strings, ``+``/``%`` and conditional expressions. Anything else (a dict key, a compared kind, an
attribute name) is not a message, whatever it reads like.

Standard library only: the project's tests import this without mutmut.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MessageRules:
    """Where a string is a message (the [tool.san-mutation] table; every field a list of fnmatch patterns)."""

    message_calls: tuple[str, ...] = ()
    message_keywords: tuple[str, ...] = ()
    message_names: tuple[str, ...] = ()
    message_returns: tuple[str, ...] = ("__repr__", "__str__")

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "[tool.san-mutation]") -> MessageRules:
        """The rules from a TOML table; an unknown key or a value that is not a list of strings is a ValueError."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        values: dict[str, tuple[str, ...]] = {}
        for key, value in table.items():
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{where}: {key} must be a list of strings, got {value!r:.60}")
            values[key] = tuple(value)
        return cls(**values)


@dataclass(frozen=True)
class Difference:
    """One place where a mutant differs from its original: the ancestors (node, field) from the function down,
    and the two values there (nodes, lists of nodes, or plain values)."""

    chain: tuple[tuple[ast.AST, str], ...]
    before: object
    after: object


def differences(before: ast.AST, after: ast.AST) -> list[Difference]:
    """The smallest differing places of two trees (the function's name excluded by the caller)."""
    out: list[Difference] = []
    _diff(before, after, (), out)
    return out


def _diff(a: object, b: object, chain: tuple[tuple[ast.AST, str], ...], out: list[Difference]) -> None:
    if type(a) is not type(b):
        out.append(Difference(chain, a, b))
    elif isinstance(a, ast.AST):
        assert isinstance(b, ast.AST)
        for field in a._fields:
            va, vb = getattr(a, field, None), getattr(b, field, None)
            link = (*chain, (a, field))
            if isinstance(va, list) and isinstance(vb, list):
                if len(va) != len(vb):
                    out.append(Difference(link, va, vb))
                else:
                    for x, y in zip(va, vb, strict=True):
                        _diff(x, y, link, out)
            else:
                _diff(va, vb, link, out)
    elif a != b:
        out.append(Difference(chain, a, b))


def _matches(name: str | None, patterns: tuple[str, ...]) -> bool:
    return name is not None and any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _message_arguments(call: ast.Call, rules: MessageRules) -> tuple[int, int] | None:
    """Which positional arguments of ``call`` are messages, as a range [start, stop), per the first
    ``message_calls`` entry whose pattern matches the callee: ``"NAME"`` all of them (and its keyword arguments),
    ``"NAME 1:"`` the second on, ``"NAME 0"`` only the first. None: the call takes no message."""
    callee = ast.unparse(call.func)
    for entry in rules.message_calls:
        pattern, _, spec = entry.partition(" ")
        if not fnmatch.fnmatchcase(callee, pattern):
            continue
        if not spec:
            return (0, 1 << 30)
        first, colon, last = spec.partition(":")
        start = int(first or 0)
        return (start, int(last) if last else 1 << 30) if colon else (start, start + 1)
    return None


def _message_link(chain: tuple[tuple[ast.AST, str], ...], k: int, child: object, function: str,
                  rules: MessageRules) -> bool:
    """Whether the link ``chain[k]`` (a node and the field ``child`` hangs from) puts ``child`` in a message."""
    node, field = chain[k]
    if isinstance(node, ast.Call) and field == "args":
        span = _message_arguments(node, rules)
        index = next((i for i, a in enumerate(node.args) if a is child), -1)
        return span is not None and span[0] <= index < span[1]
    if isinstance(node, ast.Call) and field == "keywords":
        span = _message_arguments(node, rules)
        return span == (0, 1 << 30) or (isinstance(child, ast.keyword) and _matches(child.arg, rules.message_keywords))
    if isinstance(node, ast.keyword) and field == "value":
        return _matches(node.arg, rules.message_keywords)
    if isinstance(node, ast.Assert):
        return field == "msg"
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and field == "value":
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return all(isinstance(t, ast.Name) and _matches(t.id, rules.message_names) for t in targets)
    if isinstance(node, ast.Return):
        return _matches(function, rules.message_returns)
    return False


def _in_message(chain: tuple[tuple[ast.AST, str], ...], place: object, function: str, rules: MessageRules) -> bool:
    """Whether ``place`` (the node at the end of ``chain``) lies in a message. Under a message name or return
    (which may hold a list of messages, or be tested for emptiness) only inside a string: a literal, or within
    an f-string."""
    for k in range(len(chain)):
        child = chain[k + 1][0] if k + 1 < len(chain) else place
        if _message_link(chain, k, child, function, rules):
            if isinstance(chain[k][0], (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return)):
                value = chain[k + 1][0] if k + 1 < len(chain) else place
                return (_is_string(place) or any(isinstance(node, ast.JoinedStr) for node, _ in chain[k + 1:])
                        or (isinstance(value, ast.IfExp) and _is_string(value.body) and _is_string(value.orelse)))
            return True
    return False


def _is_string(node: object) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _message_only_difference(d: Difference, function: str, rules: MessageRules) -> bool:
    if isinstance(d.before, list) and isinstance(d.after, list) and d.chain:
        # An argument dropped: message-only when it was the last positional one (no other moved) and a message.
        call, field = d.chain[-1]
        if not (isinstance(call, ast.Call) and field == "args" and len(d.before) == len(d.after) + 1):
            return False
        if ast.dump(ast.Module(d.before[:-1], [])) != ast.dump(ast.Module(d.after, [])):
            return False
        return _in_message(d.chain, d.before[-1], function, rules)
    if isinstance(d.before, ast.AST) or isinstance(d.after, ast.AST):
        place: object = d.before
    elif d.chain:
        place, d = d.chain[-1][0], Difference(d.chain[:-1], d.chain[-1][0], None)  # a field's value: its node
    else:
        return False
    return _in_message(d.chain, place, function, rules)


def is_message_only(original: ast.FunctionDef | ast.AsyncFunctionDef, mutant: ast.FunctionDef | ast.AsyncFunctionDef,
                    rules: MessageRules, function: str | None = None) -> bool:
    """Whether ``mutant`` differs from ``original`` only in messages (names aside). ``function`` is the name the
    ``message_returns`` patterns see (default: the original's name)."""
    original_copy, mutant_copy = copy.deepcopy(original), copy.deepcopy(mutant)
    mutant_copy.name = original_copy.name  # the one field that always differs
    found = differences(original_copy, mutant_copy)
    name = function if function is not None else original.name
    return bool(found) and all(_message_only_difference(d, name, rules) for d in found)


MUTMUT_ORIG = "__mutmut_orig"


def _mangled_functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def plain_name(mangled: str) -> str:
    """``xǁClassǁmethod`` -> ``Class.method``, ``x_function`` -> ``function``."""
    if mangled.startswith("xǁ"):
        return ".".join(part for part in mangled[2:].split("ǁ") if part)
    return mangled[2:] if mangled.startswith("x_") else mangled


def mutant_functions(mutated_source: str) -> dict[str, tuple[ast.FunctionDef | ast.AsyncFunctionDef,
                                                             ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Each mutant's local name in a file mutmut wrote (``x_f__mutmut_3``, ``xǁCǁm__mutmut_1``) -> (the
    original function, the mutant function)."""
    functions = list(_mangled_functions(ast.parse(mutated_source)))
    originals = {f.name[: -len(MUTMUT_ORIG)]: f for f in functions if f.name.endswith(MUTMUT_ORIG)}
    out: dict[str, tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for f in functions:
        base, sep, number = f.name.rpartition("__mutmut_")
        if sep and number.isdigit() and base in originals:
            out[f.name] = (originals[base], f)
    return out


def message_only_mutants(mutated_source: str, rules: MessageRules) -> set[str]:
    """The local names of the message-only mutants in a file mutmut wrote."""
    found = set()
    for name, (original, mutant) in mutant_functions(mutated_source).items():
        function = plain_name(original.name[: -len(MUTMUT_ORIG)]).rpartition(".")[2]
        if is_message_only(original, mutant, rules, function):
            found.add(name)
    return found
