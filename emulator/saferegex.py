"""A regular-expression matcher whose run time is linear in the name: no input can hang it.

Semantics: docs/checkpoints.md ("Limits"). Checkpoint configs carry ``re:`` patterns
(auto-round ``extra_config`` keys, compressed-tensors ``targets`` / ``ignore``) that the
toolkits match with Python's ``re``. A backtracking engine can take exponential time on a
short pattern (``(a|a?)+$`` style), so qconform never hands a config's pattern to ``re``:
the pattern is parsed with Python's own parser (``re._parser``, so the syntax is exactly
Python's) and run as a Thompson NFA, simulating every alternative at once (cost at most
states x characters; with a transition cache usually one dictionary look-up a character).

Whether a pattern matches a name is the same as with ``re.match`` / ``re.fullmatch`` for every
construct it accepts: literals, classes, categories (``\\d \\w \\s`` in Unicode or ASCII
mode), ``.``, groups, alternation, greedy and lazy repeats, the anchors ``^ $ \\A \\Z \\b \\B``
and the flags ``i m s a x``. Constructs that need backtracking to define them
(backreferences, look-around, conditionals, atomic groups, possessive repeats) are refused
with an error naming the pattern, as are patterns longer than ``MAX_PATTERN_CHARS`` or
compiling to more than ``MAX_STATES`` states. Pure standard library, no dependency.
"""

from __future__ import annotations

import re
import warnings

from .errors import UnsupportedFormatError

try:  # Python >= 3.11
    from re import _constants as _c, _parser as _p
except ImportError:  # pragma: no cover - Python 3.10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import sre_constants as _c  # type: ignore[no-redef]
        import sre_parse as _p  # type: ignore[no-redef]

__all__ = ["SafeRegex", "Budget", "compile_safe", "MAX_PATTERN_CHARS", "MAX_STATES", "MAX_CONFIG_PATTERNS"]

MAX_PATTERN_CHARS = 4096
MAX_STATES = 5_000
#: ``re:`` patterns one checkpoint config may hold in all (extra_config keys, targets, ignore): counted before
#: any is compiled (a toolkit writes a handful; compiling costs about 1 ms each)
MAX_CONFIG_PATTERNS = 1_000
_CACHE_LIMIT = 50_000  # transition-cache entries kept per pattern before the cache is dropped

_CHAR, _SPLIT, _ASSERT, _MATCH = range(4)
_I, _M, _S, _A = re.IGNORECASE, re.MULTILINE, re.DOTALL, re.ASCII


class _Refused(Exception):
    pass


def _is_word(ch: "str | None", ascii_only: bool) -> bool:
    if ch is None:
        return False
    if ascii_only and ord(ch) >= 128:
        return False
    return ch.isalnum() or ch == "_"


def _category(cat, ascii_only: bool):
    def asc(f):
        return (lambda ch: ord(ch) < 128 and f(ch)) if ascii_only else f

    table = {
        _c.CATEGORY_DIGIT: asc(str.isdecimal),
        _c.CATEGORY_SPACE: asc(lambda ch: ch.isspace() or (ascii_only and ch in "\x1c\x1d\x1e\x1f")),
        _c.CATEGORY_WORD: lambda ch: _is_word(ch, ascii_only),
        _c.CATEGORY_LINEBREAK: lambda ch: ch == "\n",
    }
    negated = {
        _c.CATEGORY_NOT_DIGIT: _c.CATEGORY_DIGIT, _c.CATEGORY_NOT_SPACE: _c.CATEGORY_SPACE,
        _c.CATEGORY_NOT_WORD: _c.CATEGORY_WORD, _c.CATEGORY_NOT_LINEBREAK: _c.CATEGORY_LINEBREAK,
    }
    if cat in table:
        return table[cat]
    if cat in negated:
        f = table[negated[cat]]
        return lambda ch: not f(ch)
    raise _Refused(f"category {cat}")


def _folds(ch: str) -> set:
    return {ch, ch.lower(), ch.upper(), ch.casefold()} if len(ch.casefold()) == 1 else {ch, ch.lower(), ch.upper()}


class _Builder:
    """Thompson construction, built back to front: each call gets the state that follows."""

    def __init__(self):
        self.states: list = []

    def add(self, st: list) -> int:
        if len(self.states) >= MAX_STATES:
            raise _Refused(f"more than {MAX_STATES} NFA states")
        self.states.append(st)
        return len(self.states) - 1

    def seq(self, items, flags: int, nxt: int) -> int:
        for op, av in reversed(list(items)):
            nxt = self.item(op, av, flags, nxt)
        return nxt

    def char(self, pred, flags: int, nxt: int) -> int:
        return self.add([_CHAR, pred, nxt])

    def item(self, op, av, flags: int, nxt: int) -> int:
        icase, asc = bool(flags & _I), bool(flags & _A)
        if op is _c.LITERAL or op is _c.NOT_LITERAL:
            want = {chr(av)} if not icase else _folds(chr(av))
            if icase:
                hit = lambda ch, w=want: ch in w or ch.lower() in w  # noqa: E731
            else:
                hit = lambda ch, w=chr(av): ch == w  # noqa: E731
            pred = hit if op is _c.LITERAL else (lambda ch, h=hit: not h(ch))
            return self.char(pred, flags, nxt)
        if op is _c.ANY:
            dotall = bool(flags & _S)
            return self.char((lambda ch: True) if dotall else (lambda ch: ch != "\n"), flags, nxt)
        if op is _c.IN:
            return self.char(self._class(av, icase, asc), flags, nxt)
        if op is _c.BRANCH:
            _, alts = av
            starts = [self.seq(a, flags, nxt) for a in alts]
            s = starts[-1]
            for a in reversed(starts[:-1]):
                s = self.add([_SPLIT, a, s])
            return s
        if op is _c.SUBPATTERN:
            _group, add, dele, sub = av
            return self.seq(sub, (flags | add) & ~dele, nxt)
        if op is _c.MAX_REPEAT or op is _c.MIN_REPEAT:
            lo, hi, sub = av
            # Greedy and lazy repeats accept the same set of strings; only "is there a match" is asked.
            if hi is _c.MAXREPEAT:
                loop = self.add([_SPLIT, -1, nxt])
                loop_body = self.seq(sub, flags, loop)
                self.states[loop][1] = loop_body
                nxt = loop
            else:
                for _ in range(hi - lo):
                    body = self.seq(sub, flags, nxt)
                    nxt = self.add([_SPLIT, body, nxt])
            for _ in range(lo):
                nxt = self.seq(sub, flags, nxt)
            return nxt
        if op is _c.AT:
            return self.add([_ASSERT, (av, bool(flags & _M), asc), nxt])
        raise _Refused(str(op).lower())

    def _class(self, items, icase: bool, asc: bool):
        negate = False
        lits: set = set()
        ranges: list = []
        cats: list = []
        for op, av in items:
            if op is _c.NEGATE:
                negate = True
            elif op is _c.LITERAL:
                lits.add(chr(av))
            elif op is _c.RANGE:
                ranges.append(av)
            elif op is _c.CATEGORY:
                cats.append(_category(av, asc))
            else:
                raise _Refused(f"class item {op}")

        def one(ch: str) -> bool:
            if ch in lits:
                return True
            o = ord(ch)
            if any(a <= o <= b for a, b in ranges):
                return True
            return any(f(ch) for f in cats)

        if icase:
            base = one
            one = lambda ch: any(base(v) for v in _folds(ch))  # noqa: E731
        return (lambda ch: not one(ch)) if negate else one


def _assert_ok(spec, s: str, pos: int) -> bool:
    at, multiline, asc = spec
    n = len(s)
    prev = s[pos - 1] if pos > 0 else None
    cur = s[pos] if pos < n else None
    if at is _c.AT_BEGINNING:
        return pos == 0 or (multiline and prev == "\n")
    if at is _c.AT_BEGINNING_STRING:
        return pos == 0
    if at is _c.AT_END:
        return pos == n or (pos == n - 1 and cur == "\n") or (multiline and cur == "\n")
    if at is _c.AT_END_STRING:
        return pos == n
    if at is _c.AT_BOUNDARY:
        return n > 0 and _is_word(prev, asc) != _is_word(cur, asc)
    if at is _c.AT_NON_BOUNDARY:
        return n > 0 and _is_word(prev, asc) == _is_word(cur, asc)
    raise _Refused(f"anchor {at}")  # pragma: no cover - every AT the parser emits is listed


class SafeRegex:
    """A compiled pattern: ``match`` (anchored at the start) and ``fullmatch`` like ``re``'s."""

    def __init__(self, pattern: str, states: list, start: int, has_asserts: bool):
        self.pattern = pattern
        self._states = states
        self._start = start
        self._has_asserts = has_asserts
        self._cache: dict = {}

    def _closure(self, seeds, s: str, pos: int, budget: "Budget | None") -> frozenset:
        if budget is not None:
            budget.spend(len(self._states), self.pattern)
        out = set()
        stack = list(seeds)
        states = self._states
        while stack:
            i = stack.pop()
            if i in out:
                continue
            out.add(i)
            st = states[i]
            kind = st[0]
            if kind is _SPLIT:
                stack.append(st[1])
                stack.append(st[2])
            elif kind is _ASSERT:
                if _assert_ok(st[1], s, pos):
                    stack.append(st[2])
        return frozenset(out)

    def _ctx(self, s: str, pos: int):
        """What the closure at ``pos`` can depend on (assertions look one character either side)."""
        if not self._has_asserts:
            return None
        n = len(s)
        return (s[pos - 1] if pos > 0 else None, s[pos] if pos < n else None, pos == n - 1)

    def _run(self, s: str, full: bool, budget: "Budget | None") -> bool:
        if not isinstance(s, str):
            raise TypeError("SafeRegex matches str names only")
        states, cache, n = self._states, self._cache, len(s)
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        key = ("start", self._ctx(s, 0))
        cur = cache.get(key)
        if cur is None:
            cur = cache[key] = self._closure([self._start], s, 0, budget)
        final = 0  # the match state is built first (compile_safe)
        for pos in range(n + 1):
            if final in cur and (not full or pos == n):
                return True
            if pos == n or not cur:
                return False
            ch = s[pos]
            key = (cur, ch, self._ctx(s, pos + 1))
            nxt = cache.get(key)
            if nxt is None:
                seeds = [st[2] for st in (states[i] for i in cur) if st[0] is _CHAR and st[1](ch)]
                nxt = cache[key] = self._closure(seeds, s, pos + 1, budget)
            cur = nxt
        return False  # pragma: no cover - the loop returns at pos == n

    def match(self, s: str, budget: "Budget | None" = None) -> bool:
        if budget is not None:
            budget.spend(len(s) + 1, self.pattern)  # the characters this match can read, cached or not
        return self._run(s, False, budget)

    def fullmatch(self, s: str, budget: "Budget | None" = None) -> bool:
        if budget is not None:
            budget.spend(len(s) + 1, self.pattern)
        return self._run(s, True, budget)


class Budget:
    """Work allowed to all the matching one command does, so a config with many patterns and a header with
    many long names cannot add up to a hang: NFA state visits on a cache miss, one step per character a match
    reads (cache hits included), one per (name, config entry) test, and each pattern's compilation (its
    states plus its characters). ``memo`` holds what one checkpoint's matching prepares once (its compiled
    patterns, the plain-name sets of its lists), so nothing is rebuilt per layer."""

    def __init__(self, limit: int = 20_000_000, where: str = "quantization_config"):
        self.left = limit
        self.limit = limit
        self.where = where
        self.memo: dict = {}
        self.compiled: dict = {}

    def compile(self, pattern: str) -> "SafeRegex":
        """``compile_safe`` once per pattern for this budget, its cost charged."""
        rx = self.compiled.get(pattern)
        if rx is None:
            rx = self.compiled[pattern] = compile_safe(pattern, where=self.where)
            self.spend(len(rx._states) + len(pattern), pattern)
        return rx

    def spend(self, n: int, pattern: str) -> None:
        self.left -= n
        if self.left < 0:
            shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
            raise UnsupportedFormatError(
                f"{self.where}: matching its re: patterns against the tensor names needs more than {self.limit} "
                f"NFA steps (last pattern 're:{shown}'); qconform stops rather than hang")


_COMPILED: dict = {}


def compile_safe(pattern: str, *, where: str = "quantization_config") -> SafeRegex:
    """Compile ``pattern`` (Python syntax, without the ``re:`` prefix) or raise an
    UnsupportedFormatError naming it and the reason."""
    if not isinstance(pattern, str):
        raise UnsupportedFormatError(f"{where}: pattern {pattern!r} is not a string")
    hit = _COMPILED.get(pattern)
    if hit is not None:
        return hit
    shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UnsupportedFormatError(f"{where}: pattern 're:{shown}' is longer than {MAX_PATTERN_CHARS} characters "
                                     "(the limit of qconform's linear-time matcher)")
    try:
        parsed = _p.parse(pattern, 0)
    except (re.error, RecursionError, OverflowError, ValueError) as e:
        raise UnsupportedFormatError(f"{where}: pattern 're:{shown}' is not a valid regular expression "
                                     f"({type(e).__name__}: {e})") from None
    flags = parsed.state.flags
    if flags & (re.LOCALE | getattr(re, "DEBUG", 0)):
        raise UnsupportedFormatError(f"{where}: pattern 're:{shown}' uses a flag qconform does not match")
    b = _Builder()
    final = b.add([_MATCH])
    assert final == 0
    try:
        start = b.seq(parsed, flags, final)
    except _Refused as e:
        raise UnsupportedFormatError(
            f"{where}: pattern 're:{shown}' is refused by qconform's linear-time matcher ({e}; backreferences, "
            "look-around, conditionals, atomic groups and possessive repeats are not accepted)") from None
    except RecursionError:
        raise UnsupportedFormatError(f"{where}: pattern 're:{shown}' nests too deeply") from None
    rx = SafeRegex(pattern, b.states, start, any(st[0] is _ASSERT for st in b.states))
    if len(_COMPILED) > 4096:
        _COMPILED.clear()
    _COMPILED[pattern] = rx
    return rx
