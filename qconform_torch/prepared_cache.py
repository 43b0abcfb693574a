"""The op's cache of prepared kernels (for the emulator backend: a layer's dequantized fp32 weight), bounded in
bytes, **scan-resistant**.

Semantics: docs/fallback.md#memory (what is cached, the budget); why this policy: docs/fallback.md#the-cache.

A model's forward pass requests every layer once, in the same order, every time. A plain LRU smaller than
the model evicts each layer just before it is requested again, so it never hits (measured: 0 hits in 280
calls). Here an entry is replaced only by one requested *more often* than it (a frequency count per key,
kept also for keys not cached, bounded): in a repeated scan every layer is requested equally often, so the
layers admitted first stay, the rest are streamed, and a budget of C MiB saves about C MiB of preparation
per forward. Entries no longer requested (another model, freed weights) fall behind the counts of those
that are, and are replaced by them.
"""

from __future__ import annotations

import threading

__all__ = ["PreparedCache"]

#: counts kept for keys that are not cached (the layers being streamed); the oldest beyond this are forgotten
MAX_GHOSTS = 1 << 14


class PreparedCache:
    """Prepared kernels by key, at most ``budget`` bytes, replaced by request frequency (module docstring)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self.peak = 0
        self.hits = self.misses = self.uncached = 0
        # the exact path (no cache): layer calls, those computed in row blocks, elements the float64 bound
        # left undecided (the reference decided those from their exact value: emulator/numerics/exact_sum.py)
        self.exact_calls = self.exact_blocked = self.exact_ambiguous = 0
        self._d: dict = {}  # key -> (value, nbytes)
        self._count: dict = {}  # key -> requests so far (cached or not); insertion order = first request
        self._tick = 0
        self._last: dict = {}  # key -> tick of its last request (ties between equal counts: older goes)
        self._lock = threading.Lock()

    def _request(self, key) -> None:
        self._tick += 1
        self._count[key] = self._count.get(key, 0) + 1
        self._last[key] = self._tick
        if len(self._count) > MAX_GHOSTS + len(self._d):
            for k in list(self._count)[:len(self._count) // 4]:
                if k not in self._d:
                    del self._count[k]
                    self._last.pop(k, None)

    def get(self, key):
        """The cached value, or None (a miss); either way the request is counted."""
        with self._lock:
            self._request(key)
            v = self._d.get(key)
            if v is not None:
                self.hits += 1
                return v[0]
            self.misses += 1
            return None

    def peek(self, key):
        """The cached value, or None; not counted as a request (``get`` counts it)."""
        with self._lock:
            v = self._d.get(key)
            return None if v is None else v[0]

    def count_exact(self, blocked: bool, ambiguous: int) -> None:
        """One exact reference call (op._reference): whether it ran in more than one row block, and how many
        of its rows were ambiguous."""
        with self._lock:
            self.exact_calls += 1
            self.exact_blocked += blocked
            self.exact_ambiguous += ambiguous

    def count_streamed(self, key) -> None:
        """A request the caller served without the cache (``admits`` said no): a miss, uncached."""
        with self._lock:
            self._request(key)
            self.misses += 1
            self.uncached += 1

    def _victims(self, key, nbytes: int):
        """Entries to evict for ``key`` (list), or None where it is not admitted: it must fit the budget and
        every entry evicted for it must have been requested less often than it (ties: not evicted)."""
        if nbytes > self.budget:
            return None
        free = self.budget - self.used
        if nbytes <= free:
            return []
        mine = self._count.get(key, 0)
        out = []
        for k in sorted(self._d, key=lambda k: (self._count.get(k, 0), self._last.get(k, 0))):
            if self._count.get(k, 0) >= mine:
                return None
            out.append(k)
            free += self._d[k][1]
            if nbytes <= free:
                return out
        return None

    def admits(self, key, nbytes: int) -> bool:
        """Whether ``put(key, ...)`` of ``nbytes`` would be cached now (the caller streams the layer if not)."""
        with self._lock:
            return key in self._d or self._victims(key, nbytes) is not None

    def put(self, key, value, nbytes: int) -> bool:
        """Cache ``value`` if the policy admits it (evicting less requested entries); False: not cached."""
        with self._lock:
            victims = self._victims(key, nbytes)
            if victims is None:
                self.uncached += 1
                return False
            for k in victims:
                self.used -= self._d.pop(k)[1]
            self._d[key] = (value, nbytes)
            self.used += nbytes
            self.peak = max(self.peak, self.used)
            return True

    def keys(self) -> list:
        with self._lock:
            return list(self._d)

    def discard(self, keep) -> int:
        """Drop every entry whose key ``keep(key)`` rejects (and its request count); how many were dropped. The
        op drops what a dispatcher's timing prepared for contenders that lost (their counts from the timing
        runs would otherwise outrank the chosen path's entries once the model outgrows the budget)."""
        with self._lock:
            gone = [k for k in self._d if not keep(k)]
            for k in gone:
                self.used -= self._d.pop(k)[1]
                self._count.pop(k, None)
                self._last.pop(k, None)
            return len(gone)

    def clear(self):
        with self._lock:
            self._d.clear()
            self._count.clear()
            self._last.clear()
            self.used = 0

    def reset(self, budget: int) -> None:
        """Empty, with a new budget and zeroed statistics."""
        self.clear()
        with self._lock:
            self.budget = budget
            self.peak = 0
            self.hits = self.misses = self.uncached = 0
            self.exact_calls = self.exact_blocked = self.exact_ambiguous = 0

    def stats(self) -> dict:
        return {"budget_bytes": self.budget, "used_bytes": self.used, "peak_bytes": self.peak,
                "hits": self.hits, "misses": self.misses, "uncached": self.uncached,
                "exact_calls": self.exact_calls, "exact_blocked": self.exact_blocked,
                "exact_ambiguous": self.exact_ambiguous}
