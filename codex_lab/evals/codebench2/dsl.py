"""The program space of codebench 2: a typed DSL of primitive steps over ints, lists and strings.

Anchors: DeepCoder's list DSL (Balog et al. 2017: map/filter/sort/reverse/take/drop/scanl1/
zipwith/sum/maximum/count) and ExeDec's compositional splits over it (Shi et al. 2023,
arXiv 2307.13883), plus a few string operations (upper, lower, strip, slice, replace, split,
join) in the spirit of ExeDec's string DSL.

A **program** is 1-4 steps; each step is a :class:`Primitive` with its constants. Every
primitive has a type signature over four types (:data:`TYPES`):

- ``list``  (a list of ints), ``int``, ``str`` (ASCII text), ``words`` (a list of strings).

Composition is type-checked: a step's input type is the previous step's output type (the
first step's is the program's input type, ``list`` or ``str``). So list->list steps chain,
a reducer (list->int) may end the chain or be followed by int->int steps, ``split`` turns a
string into words, ``join`` words back into a string.

Renderings (one statement per step, readable):

- Python: ``def name(arg):`` + a docstring written from the composition (one clause per
  step, e.g. "Keep the items greater than 3, sort them in descending order, then keep the
  first 2.") + optional ``>>>`` examples + one assignment per step + ``return``;
- JavaScript: the same steps as ``function name(arg) { ... }`` (the ``translate`` family).

The semantics is the Python rendering itself: :meth:`Program.run` executes the rendered
source (our own text, never model output), so "what the docstring says", "what the hidden
tests expect" and "what the canonical body does" cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Sequence

TYPES: tuple[str, ...] = ("list", "int", "str", "words")
INPUT_TYPES: tuple[str, ...] = ("list", "str")

# Constant domains: the values a parameter of each kind may take (sampled uniformly).
DOMAINS: dict[str, tuple[Any, ...]] = {
    "add": tuple(range(1, 10)),        # added / subtracted amounts
    "mul": (2, 3, 4, 5),               # multipliers (0 and 1 would make a step dead)
    "thr": tuple(range(0, 10)),        # comparison thresholds and caps
    "cnt": (1, 2, 3, 4),               # how many items / characters / words to take or drop
    "len": (1, 2, 3, 4),               # word-length thresholds
    "ch": ("a", "e", "o", "l", "s"),   # a character that occurs in the text inputs
    "sub": ("x", "*", "_", "#"),       # a replacement character (never occurs in the inputs)
    "sep": (" ", "-", ",", "/"),       # a word separator for join
}
INT_KINDS: frozenset[str] = frozenset({"add", "mul", "thr", "cnt", "len"})

# The variable holding each type's value in a rendered body (the input type's is the argument).
VAR_OF_TYPE: dict[str, str] = {"int": "result", "words": "words"}
ARG_NAMES: dict[str, tuple[str, ...]] = {"list": ("items", "xs", "values", "nums"),
                                         "str": ("text", "s", "line", "word")}
FUNC_NAMES: tuple[str, ...] = ("transform", "process", "compute", "convert", "solve", "apply_steps", "pipeline",
                               "handle")


@dataclass(frozen=True)
class Primitive:
    """One DSL operation with its type signature and its three renderings.

    Templates use ``{i}`` (the input variable), ``{o}`` (the output variable) and ``{0}``,
    ``{1}`` (the constants: ints as is, strings as JSON literals, valid in both languages).

    Attributes:
        key: unique name (the unit of a structure signature).
        src, dst: input and output type (keys of :data:`TYPES`).
        params: constant kinds (keys of :data:`DOMAINS`), in order.
        py: the Python expression computing the output from ``{i}``.
        js: the JavaScript expression (same semantics on the DSL's inputs).
        doc: the docstring clause (a verb phrase, lower case).
        swaps: primitives with the same signature and parameter kinds: the "wrong operator"
            mutations (``>`` for ``<``, ``take`` for ``drop``, ...).
    """

    key: str
    src: str
    dst: str
    params: tuple[str, ...]
    py: str
    js: str
    doc: str
    swaps: tuple[str, ...] = ()


def _p(key, src, dst, params, py, js, doc, swaps=()) -> Primitive:
    return Primitive(key, src, dst, tuple(params), py, js, doc, tuple(swaps))


L, I, S, W = "list", "int", "str", "words"
PRIMITIVES: tuple[Primitive, ...] = (
    # ---- list -> list: maps
    _p("map_add", L, L, ["add"], "[v + {0} for v in {i}]", "{i}.map(v => v + {0})", "add {0} to each item",
       ["map_sub", "map_mul"]),
    _p("map_sub", L, L, ["add"], "[v - {0} for v in {i}]", "{i}.map(v => v - {0})", "subtract {0} from each item",
       ["map_add"]),
    _p("map_mul", L, L, ["mul"], "[v * {0} for v in {i}]", "{i}.map(v => v * {0})", "multiply each item by {0}",
       ["map_add"]),
    _p("map_neg", L, L, [], "[-v for v in {i}]", "{i}.map(v => -v)", "negate each item", ["map_abs"]),
    _p("map_abs", L, L, [], "[abs(v) for v in {i}]", "{i}.map(v => Math.abs(v))",
       "replace each item by its absolute value", ["map_neg", "map_square"]),
    _p("map_square", L, L, [], "[v * v for v in {i}]", "{i}.map(v => v * v)", "square each item", ["map_abs"]),
    _p("map_cap", L, L, ["thr"], "[min(v, {0}) for v in {i}]", "{i}.map(v => Math.min(v, {0}))",
       "cap each item at {0}", ["map_floor"]),
    _p("map_floor", L, L, ["thr"], "[max(v, {0}) for v in {i}]", "{i}.map(v => Math.max(v, {0}))",
       "raise each item below {0} to {0}", ["map_cap"]),
    # ---- list -> list: filters
    _p("filter_gt", L, L, ["thr"], "[v for v in {i} if v > {0}]", "{i}.filter(v => v > {0})",
       "keep the items greater than {0}", ["filter_lt", "filter_ge"]),
    _p("filter_ge", L, L, ["thr"], "[v for v in {i} if v >= {0}]", "{i}.filter(v => v >= {0})",
       "keep the items greater than or equal to {0}", ["filter_gt", "filter_le"]),
    _p("filter_lt", L, L, ["thr"], "[v for v in {i} if v < {0}]", "{i}.filter(v => v < {0})",
       "keep the items less than {0}", ["filter_gt", "filter_le"]),
    _p("filter_le", L, L, ["thr"], "[v for v in {i} if v <= {0}]", "{i}.filter(v => v <= {0})",
       "keep the items less than or equal to {0}", ["filter_lt", "filter_ge"]),
    _p("filter_ne", L, L, ["thr"], "[v for v in {i} if v != {0}]", "{i}.filter(v => v !== {0})",
       "remove every item equal to {0}", ["filter_eq"]),
    _p("filter_eq", L, L, ["thr"], "[v for v in {i} if v == {0}]", "{i}.filter(v => v === {0})",
       "keep only the items equal to {0}", ["filter_ne"]),
    _p("filter_even", L, L, [], "[v for v in {i} if v % 2 == 0]", "{i}.filter(v => v % 2 === 0)",
       "keep the even items", ["filter_odd"]),
    _p("filter_odd", L, L, [], "[v for v in {i} if v % 2 != 0]", "{i}.filter(v => v % 2 !== 0)",
       "keep the odd items", ["filter_even"]),
    # ---- list -> list: order and slices
    _p("sort_asc", L, L, [], "sorted({i})", "[...{i}].sort((a, b) => a - b)", "sort them in ascending order",
       ["sort_desc"]),
    _p("sort_desc", L, L, [], "sorted({i}, reverse=True)", "[...{i}].sort((a, b) => b - a)",
       "sort them in descending order", ["sort_asc"]),
    _p("reverse", L, L, [], "{i}[::-1]", "[...{i}].reverse()", "reverse their order"),
    _p("take", L, L, ["cnt"], "{i}[:{0}]", "{i}.slice(0, {0})", "keep the first {0} items", ["drop"]),
    _p("drop", L, L, ["cnt"], "{i}[{0}:]", "{i}.slice({0})", "drop the first {0} items", ["take"]),
    _p("dedup", L, L, [], "[v for k, v in enumerate({i}) if v not in {i}[:k]]",
       "{i}.filter((v, k) => {i}.indexOf(v) === k)", "remove repeated items, keeping the first of each"),
    # ---- list -> list: scans and neighbours (DeepCoder's scanl1 / zipwith)
    _p("scan_sum", L, L, [], "[sum({i}[:k + 1]) for k in range(len({i}))]",
       "{i}.map((v, k) => {i}.slice(0, k + 1).reduce((a, b) => a + b, 0))",
       "replace each item by the running total up to it", ["scan_max"]),
    _p("scan_max", L, L, [], "[max({i}[:k + 1]) for k in range(len({i}))]",
       "{i}.map((v, k) => Math.max(...{i}.slice(0, k + 1)))", "replace each item by the largest item so far",
       ["scan_sum"]),
    _p("pair_add", L, L, [], "[a + b for a, b in zip({i}, {i}[1:])]", "{i}.slice(1).map((b, k) => {i}[k] + b)",
       "add each item to the next one", ["pair_diff"]),
    _p("pair_diff", L, L, [], "[b - a for a, b in zip({i}, {i}[1:])]", "{i}.slice(1).map((b, k) => b - {i}[k])",
       "subtract each item from the next one", ["pair_add"]),
    # ---- list -> int: reducers
    _p("sum", L, I, [], "sum({i})", "{i}.reduce((a, b) => a + b, 0)", "add them all up", ["length", "max"]),
    _p("max", L, I, [], "max({i}, default=0)", "({i}.length ? Math.max(...{i}) : 0)",
       "take the largest item (0 if there is none)", ["min"]),
    _p("min", L, I, [], "min({i}, default=0)", "({i}.length ? Math.min(...{i}) : 0)",
       "take the smallest item (0 if there is none)", ["max"]),
    _p("length", L, I, [], "len({i})", "{i}.length", "count the items", ["sum"]),
    _p("count_gt", L, I, ["thr"], "sum(1 for v in {i} if v > {0})", "{i}.filter(v => v > {0}).length",
       "count the items greater than {0}", ["count_lt"]),
    _p("count_lt", L, I, ["thr"], "sum(1 for v in {i} if v < {0})", "{i}.filter(v => v < {0}).length",
       "count the items less than {0}", ["count_gt"]),
    _p("first", L, I, [], "{i}[0] if {i} else 0", "({i}.length ? {i}[0] : 0)",
       "take the first item (0 if there is none)", ["last"]),
    _p("last", L, I, [], "{i}[-1] if {i} else 0", "({i}.length ? {i}[{i}.length - 1] : 0)",
       "take the last item (0 if there is none)", ["first"]),
    # ---- int -> int
    _p("int_add", I, I, ["add"], "{i} + {0}", "{i} + {0}", "add {0} to the result", ["int_sub", "int_mul"]),
    _p("int_sub", I, I, ["add"], "{i} - {0}", "{i} - {0}", "subtract {0} from the result", ["int_add"]),
    _p("int_mul", I, I, ["mul"], "{i} * {0}", "{i} * {0}", "multiply the result by {0}", ["int_add"]),
    # ---- str -> str
    _p("upper", S, S, [], "{i}.upper()", "{i}.toUpperCase()", "convert the text to upper case", ["lower"]),
    _p("lower", S, S, [], "{i}.lower()", "{i}.toLowerCase()", "convert the text to lower case", ["upper"]),
    _p("capitalize", S, S, [], "{i}.capitalize()", "{i}.charAt(0).toUpperCase() + {i}.slice(1).toLowerCase()",
       "capitalize the first letter and lower-case the rest", ["upper", "lower"]),
    _p("strip", S, S, [], "{i}.strip()", "{i}.trim()", "remove the spaces at both ends"),
    _p("reverse_str", S, S, [], "{i}[::-1]", "{i}.split(\"\").reverse().join(\"\")", "reverse the text"),
    _p("take_str", S, S, ["cnt"], "{i}[:{0}]", "{i}.slice(0, {0})", "keep its first {0} characters", ["drop_str"]),
    _p("drop_str", S, S, ["cnt"], "{i}[{0}:]", "{i}.slice({0})", "drop its first {0} characters", ["take_str"]),
    _p("replace", S, S, ["ch", "sub"], "{i}.replace({0}, {1})", "{i}.split({0}).join({1})",
       "replace every {0} with {1}"),
    _p("remove", S, S, ["ch"], "{i}.replace({0}, \"\")", "{i}.split({0}).join(\"\")", "remove every {0}"),
    # ---- str -> int
    _p("str_len", S, I, [], "len({i})", "{i}.length", "count the characters", ["count_char"]),
    _p("count_char", S, I, ["ch"], "{i}.count({0})", "{i}.split({0}).length - 1", "count the {0} characters"),
    # ---- str -> words
    _p("split", S, W, [], "{i}.split()", "{i}.split(\" \").filter(w => w)", "split the text into words"),
    # ---- words -> words
    _p("sort_words", W, W, [], "sorted({i})", "[...{i}].sort()", "sort the words alphabetically"),
    _p("reverse_words", W, W, [], "{i}[::-1]", "[...{i}].reverse()", "reverse the order of the words"),
    _p("long_words", W, W, ["len"], "[w for w in {i} if len(w) > {0}]", "{i}.filter(w => w.length > {0})",
       "keep the words longer than {0} characters", ["short_words"]),
    _p("short_words", W, W, ["len"], "[w for w in {i} if len(w) < {0}]", "{i}.filter(w => w.length < {0})",
       "keep the words shorter than {0} characters", ["long_words"]),
    _p("take_words", W, W, ["cnt"], "{i}[:{0}]", "{i}.slice(0, {0})", "keep the first {0} words", ["drop_words"]),
    _p("drop_words", W, W, ["cnt"], "{i}[{0}:]", "{i}.slice({0})", "drop the first {0} words", ["take_words"]),
    _p("cap_words", W, W, [], "[w.capitalize() for w in {i}]",
       "{i}.map(w => w.charAt(0).toUpperCase() + w.slice(1).toLowerCase())", "capitalize each word",
       ["upper_words"]),
    _p("upper_words", W, W, [], "[w.upper() for w in {i}]", "{i}.map(w => w.toUpperCase())",
       "convert each word to upper case", ["cap_words"]),
    # ---- words -> str / int
    _p("join", W, S, ["sep"], "{0}.join({i})", "{i}.join({0})", "join the words with {0}"),
    _p("word_count", W, I, [], "len({i})", "{i}.length", "count the words"),
)
PRIMS: dict[str, Primitive] = {p.key: p for p in PRIMITIVES}
assert len(PRIMS) == len(PRIMITIVES), "primitive keys must be unique"


def literal(value: Any) -> str:
    """A constant as source text valid in Python and JavaScript: ints as is, strings as JSON."""
    return json.dumps(value) if isinstance(value, str) else str(int(value))


@dataclass(frozen=True)
class Step:
    """One primitive applied with its constants (``args`` follow ``PRIMS[key].params``)."""

    key: str
    args: tuple[Any, ...] = ()

    @property
    def prim(self) -> Primitive:
        return PRIMS[self.key]

    def clause(self) -> str:
        return self.prim.doc.format(*(literal(a) for a in self.args))


@dataclass(frozen=True)
class Program:
    """A composition of steps with its input type, argument name and function name.

    ``steps`` may be empty only for a mutant (the "partial program" of a one-step program).
    Raises ``TypeError`` on construction when the steps do not compose (see :func:`check_types`).
    """

    input_type: str
    steps: tuple[Step, ...]
    arg: str = "items"
    name: str = "transform"
    _types: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_types", check_types(self.input_type, self.steps))

    # ---- identity
    @property
    def signature(self) -> tuple[str, ...]:
        """The structure: primitive names in order, constants masked (the unit of every split)."""
        return tuple(s.key for s in self.steps)

    @property
    def output_type(self) -> str:
        return self._types[-1]

    @property
    def uid(self) -> str:
        """A stable id: ``p`` + 10 hex digits of sha1 of the canonical source (no examples)."""
        return _uid(self)

    def var(self, t: str) -> str:
        """The variable holding a value of type ``t`` in the body (the argument for the input type)."""
        return self.arg if t == self.input_type else VAR_OF_TYPE[t]

    # ---- Python
    def docstring(self) -> str:
        """One clause per step, the last one introduced by "then"; capitalised, one sentence."""
        cl = [s.clause() for s in self.steps] or ["return the input unchanged"]
        text = cl[0] if len(cl) == 1 else ", ".join(cl[:-1]) + ", then " + cl[-1]
        return text[0].upper() + text[1:] + "."

    def header(self, examples: Sequence[tuple[Any, Any]] = ()) -> str:
        """``def name(arg):`` and its docstring (with ``>>>`` examples), each line ending in a newline."""
        doc = self.docstring()
        if not examples:
            return f'def {self.name}({self.arg}):\n    """{doc}"""\n'
        ex = "".join(f"    >>> {self.name}({x!r})\n    {y!r}\n" for x, y in examples)
        return f'def {self.name}({self.arg}):\n    """{doc}\n\n{ex}    """\n'

    def lines(self) -> list[str]:
        """The canonical body: one ``var = expr`` line per step, then ``return var`` (each ends in a newline)."""
        out = []
        for s, t_in, t_out in zip(self.steps, self._types, self._types[1:]):
            expr = s.prim.py.format(*(literal(a) for a in s.args), i=self.var(t_in))
            out.append(f"    {self.var(t_out)} = {expr}\n")
        out.append(f"    return {self.var(self.output_type)}\n")
        return out

    def body(self) -> str:
        return "".join(self.lines())

    def source(self, examples: Sequence[tuple[Any, Any]] = ()) -> str:
        """The whole canonical Python function."""
        return _source(self) if not examples else self.header(examples) + self.body()

    # ---- JavaScript
    def js_lines(self) -> list[str]:
        """The canonical JavaScript body: ``let`` on a variable's first assignment, one line per step."""
        seen = {self.arg}
        out = []
        for s, t_in, t_out in zip(self.steps, self._types, self._types[1:]):
            o = self.var(t_out)
            expr = s.prim.js.format(*(literal(a) for a in s.args), i=self.var(t_in))
            out.append(f"  {'' if o in seen else 'let '}{o} = {expr};\n")
            seen.add(o)
        out.append(f"  return {self.var(self.output_type)};\n")
        return out

    def js_source(self) -> str:
        """The whole canonical JavaScript function (the ``translate`` family's answer)."""
        return f"function {self.name}({self.arg}) {{\n" + "".join(self.js_lines()) + "}\n"

    # ---- semantics
    def function(self) -> Callable[[Any], Any]:
        """The rendered Python function, compiled (trusted text: our own rendering, never model output)."""
        return _compile(self.source(), self.name)

    def run(self, x: Any) -> Any:
        """The program's output on ``x`` (the canonical Python body, executed in-process)."""
        return self.function()(_copy(x))


@lru_cache(maxsize=65_536)
def _source(program: Program) -> str:
    return program.header() + program.body()


@lru_cache(maxsize=65_536)
def _uid(program: Program) -> str:
    return "p" + hashlib.sha1(_source(program).encode("utf-8")).hexdigest()[:10]


def _copy(x: Any) -> Any:
    return list(x) if isinstance(x, list) else x


@lru_cache(maxsize=65_536)
def _compile(source: str, name: str) -> Callable[[Any], Any]:
    ns: dict[str, Any] = {}
    exec(compile(source, "<codebench2>", "exec"), ns)  # noqa: S102 - the DSL's own rendering
    return ns[name]


def check_types(input_type: str, steps: Sequence[Step]) -> tuple[str, ...]:
    """The type after each step, starting with ``input_type``: (t0, t1, ..., tn).

    Raises:
        TypeError: an unknown primitive, a wrong number of constants, or a step whose input
            type is not the previous step's output type.
    """
    if input_type not in INPUT_TYPES:
        raise TypeError(f"input type must be one of {list(INPUT_TYPES)}, got {input_type!r}")
    types = [input_type]
    for s in steps:
        if s.key not in PRIMS:
            raise TypeError(f"unknown primitive {s.key!r}")
        p = PRIMS[s.key]
        if len(s.args) != len(p.params):
            raise TypeError(f"{s.key} takes {len(p.params)} constants, got {len(s.args)}")
        if p.src != types[-1]:
            raise TypeError(f"{s.key} takes {p.src}, but the previous step gives {types[-1]}")
        types.append(p.dst)
    return tuple(types)


def successors(t: str) -> list[Primitive]:
    """Primitives that can follow a value of type ``t`` (in :data:`PRIMITIVES` order)."""
    return [p for p in PRIMITIVES if p.src == t]


def random_args(prim: Primitive, rng: Any) -> tuple[Any, ...]:
    """Constants for ``prim`` drawn from :data:`DOMAINS` with ``rng`` (a ``random.Random``)."""
    return tuple(rng.choice(DOMAINS[k]) for k in prim.params)


def int_constants(program: Program) -> list[int]:
    """Every int constant of the program (thresholds, amounts, counts), in step order."""
    return [a for s in program.steps for a, k in zip(s.args, s.prim.params) if k in INT_KINDS]


def char_constants(program: Program) -> list[str]:
    """Every character constant of the program (``ch`` kinds: the ones that occur in inputs)."""
    return [a for s in program.steps for a, k in zip(s.args, s.prim.params) if k == "ch"]
