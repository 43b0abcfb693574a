"""The dispatcher: which backend computes a case on this host, under one pluggable policy.

Semantics: docs/fallback.md#the-dispatcher (the rules: docs/backends.md#dispatcher).

One ``Dispatcher`` object answers "who computes this case?" for every caller: ``registry.select`` (a
one-off question), the ``auto`` backend of the suite, and qconform_torch's op (which holds one). It
holds its own state: backend instances (each spec created once), the contenders admitted per layer and
case, the timings per shape class, the kernels that failed when run, and the choice lines logged.

A backend is a *contender* for a case only if the dispatcher's own rules admit it (``dispatch_refusal``:
available, can implement the case, declares it canonically or with rounding-level variants only, judged
on the layer's own tensors where given and on the call's activations where given (a rounding-level
weight dtype or activation quantizer variant such as an amax clamp is more than rounding on some tensors:
emulator/tensor_levels.py), no int32 accumulator that can wrap at this K, no known defect)
and the policy does too. The fallback (the emulator backend: its fast path) is never refused: it is the
answer when nothing else is admitted. Policies:

- ``ByPriority`` (declaration-and-priority): the highest-priority contender, else the fallback;
- ``CertifiedFastest(certifier)``: only contenders the certifier certifies for the case on this host
  (conformance/certify/dispatch.py ``CertificationStore``, passed in from above: backends never import
  the suite), timed against the fallback's fast path, the fastest kept;
- ``MeasuredFastest(cache)``: every contender, timed against the fallback's fast path on the first call
  at each shape class, the fastest kept, and kept on disk per host (backends/dispatch_cache.py).

Timed policies need a ``timer`` (the caller runs a backend on the real input); without one (the suite's
``auto``, which judges but does not time) they choose by priority. Because the fallback is always timed
too, a timed choice is never slower than the fast path; with ``floor_db`` and a ``reference`` a contender
whose output on the timing input is below that SQNR against the reference is not chosen, and every layer
that reuses its shape class's choice is checked the same way on its own first input (``_floor_gate``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import time


from emulator.numerics.sqnr import sqnr_db
from emulator.tensor_levels import WEIGHT_AXES, activation_deviation, weight_deviation
from emulator.variants import AXES, Level, Stage

from .base import Backend, Case, Declared
from .dispatch_cache import HostChoiceCache

__all__ = ["Dispatcher", "Choice", "Policy", "ByPriority", "CertifiedFastest", "MeasuredFastest", "FallbackOnly",
           "refusal", "activation_refusal", "dispatch_refusal", "shape_class", "INT8_PRODUCT_MAX"]

log = logging.getLogger("qconform.dispatch")

#: a kernel is chosen over the fast path only below (1 - this) x its time: first-call timings vary by more than a few
#: percent, and a tie goes to the fast path (canonical arithmetic, no per-call judgement, no dispatcher later)
FAST_PATH_MARGIN = 0.15

#: the largest |activation code x weight code| of an int8 W8A8 product: activations (q - zp) up to 255, weights 128
INT8_PRODUCT_MAX = 255 * 128


def refusal(backend: Backend, case: Case, allow_opaque: bool = False, tensors: dict | None = None,
            activations=None) -> str | None:
    """Why the dispatcher must not route ``case`` to ``backend`` although it can implement it.

    - a declared *semantic deviation* (emulator/variants.py levels: other weights, zero points, scales, activation
      scheme or granularity than the checkpoint defines, e.g. ARK through vLLM reading v1 GPTQ zero points without
      the +1, or per-tensor activations where the checkpoint is per-token), judged on ``tensors`` where given
      (ignoring qzeros changes nothing where every field is the midpoint): the suite certifies such a backend
      against its own declaration, but its answer is not the checkpoint's;
    - a rounding-level weight dtype that does not hold ``tensors``' scales or weights where given (a bfloat16 or
      float16 scale flushes a tiny float32 one toward zero) and a rounding-level activation quantizer variant that
      is more than rounding on ``activations`` where given (``activation_refusal``: an amax clamp zeroes rows whose
      range lies below it): emulator/tensor_levels.py;
    - an int32 accumulator whose partial sums can wrap at this K (the declared interval assumes exact sums);
    - a kernel defect the adapter knows for this case (``Backend.known_defect``);
    - no declaration at all.
    """
    try:
        declared = backend.declared(case)
    except Exception as e:  # a backend that cannot say what it computes is not selected
        return f"no declaration ({type(e).__name__}: {e})"
    if declared.arithmetic == "opaque" and not allow_opaque:
        return (f"opaque arithmetic (judged by SQNR >= {declared.sqnr_floor_db:g} dB only, not by a declared "
                "interval): not dispatched unless opted in (select(..., allow_opaque=True), auto:opaque=allow)")
    try:
        semantic = [str(d) for d in declared.deviations(case, tensors) if d.level is Level.SEMANTIC]
    except Exception as e:  # noqa: BLE001 - tensors the levels cannot read: not proven harmless
        return f"its declaration cannot be judged on this layer's tensors ({type(e).__name__}: {e})"
    if semantic:
        return (f"declares {', '.join(semantic)}: a semantic deviation (it would compute other numbers than the "
                "checkpoint defines" + ("" if tensors is not None else "; without the layer's tensors a "
                                        "tensor-dependent level counts as semantic") + ")")
    if tensors is not None:
        try:
            why = weight_deviation(declared, case, tensors)
        except Exception as e:  # noqa: BLE001 - tensors the rule cannot read: not proven harmless
            return f"its weight dtypes cannot be judged on this layer's tensors ({type(e).__name__}: {e})"
        if why:
            named = ", ".join(str(d) for d in declared.deviations(case, tensors)
                              if AXES[d.key].stage is Stage.WEIGHTS or d.key in WEIGHT_AXES) or "its weight arithmetic"
            return f"declares {named}: rounding level in general, but {why}"
    if activations is not None:
        why = activation_refusal(declared, case, activations)
        if why:
            return why
    if declared.accumulate == "int32" and case.K * INT8_PRODUCT_MAX >= 2 ** 31:
        return (f"its int32 accumulator can wrap at K = {case.K} (|product| up to {INT8_PRODUCT_MAX}: K must stay "
                f"below {2 ** 31 // INT8_PRODUCT_MAX + 1} for every sum to fit)")
    defect = backend.known_defect(case)
    if defect:
        return f"known kernel defect for this case: {defect}"
    return None


def dispatch_refusal(backend: Backend, case: Case, allow_opaque: bool = False,
                     tensors: dict | None = None, activations=None) -> str | None:
    """Why the dispatcher must not route ``case`` to ``backend``: unavailable here, cannot implement it, or
    ``refusal``; None where it may."""
    av = backend.availability()
    if not av.available:
        return f"unavailable: {av.reason}"
    sup = backend.can_implement(case)
    if not sup.ok:
        return f"cannot implement {case.describe()}: {sup.reason}"
    return refusal(backend, case, allow_opaque, tensors, activations)


def activation_refusal(declared: Declared, case: Case, activations) -> str | None:
    """Why ``declared``'s activation quantizer, rounding level in general, is more than rounding on
    ``activations`` [M, K] (emulator/tensor_levels.py: every dequantized activation within two canonical
    quantization steps of the canonical quantizer's); None where it is within rounding there."""
    try:
        why = activation_deviation(declared, case, activations)
    except Exception as e:  # noqa: BLE001 - activations the rule cannot read: not proven harmless
        return f"its activation quantizer cannot be judged on this input ({type(e).__name__}: {e})"
    if why is None:
        return None
    named = ", ".join(str(d) for d in declared.deviations(case) if AXES[d.key].stage is Stage.INT8_ACTIVATIONS) or "its quantizer"
    return (f"declares {named}: rounding level in general, but {why} (the checkpoint's answer differs beyond "
            "rounding on this input)")


def shape_class(M: int) -> tuple[int, int]:
    """The M range a timing at ``M`` stands for: powers of two (1, 2, 3-4, 5-8, ...), one class from 1025 on."""
    if M <= 1:
        return 1, 1
    if M > 1024:
        return 1025, 1 << 62
    hi = 1 << (M - 1).bit_length()
    return hi // 2 + 1, hi


@functools.lru_cache(maxsize=4096)
def _class_key(case: Case) -> str:
    """Every Case field with M replaced by its shape class: the timings are shared within it (formed once per Case)."""
    d = case.to_json()
    d["M"] = list(shape_class(case.M))
    return json.dumps(d, sort_keys=True)


# --------------------------------------------------------------------------------------------- policies


class Policy:
    """How the dispatcher chooses among the contenders its own rules admit."""

    name = "policy"
    #: times the contenders (with the fallback's fast path) where the caller gives a timer
    timed = False
    #: why the fallback answers when no contender is admitted (the choice line's bracket)
    none_admitted = "no kernel takes it"
    chosen_how = "by declaration and priority"
    cache: HostChoiceCache | None = None

    def contenders(self, specs: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
        """(the specs this policy considers, (specs, why) it never considers)."""
        return specs, []

    def why_not(self, backend: Backend, case: Case) -> str | None:
        """The policy's own refusal, after the dispatcher's rules admitted ``backend``."""
        return None

    def measured_how(self, M: int, times: dict[str, float], from_cache: bool) -> str:
        lo, hi = shape_class(M)
        span = f"M = {lo}" if lo == hi else (f"M >= {lo}" if hi > 1 << 40 else f"M in {lo}..{hi}")
        timing = ", ".join(f"{n} {t * 1e3:.3g} ms" for n, t in sorted(times.items(), key=lambda kv: kv[1]))
        where = "this host's dispatch cache" if from_cache else f"timed at M = {M}"
        return f"{self.timed_label} for {span}, {where}: {timing}"

    timed_label = "fastest"


class ByPriority(Policy):
    """The highest-priority contender (declaration-and-priority), else the fallback."""

    name = "declaration-and-priority"
    chosen_how = "uncertified: by declaration and priority"


class CertifiedFastest(Policy):
    """Only backends ``certifier`` certifies for the case on this host, timed against the fast path.

    A certifier has ``labels()`` (the backend specs it knows) and ``why_not(label, version, case)`` (None:
    certified); the suite's is ``conformance.certify.CertificationStore``."""

    name = "certified-and-fastest"
    timed = True
    none_admitted = "no backend certified for this case on this host"
    chosen_how = "certified on this host"
    timed_label = "fastest certified on this host or the fast path"

    def __init__(self, certifier):
        self.certifier = certifier

    def contenders(self, specs):
        labels = list(self.certifier.labels())
        others = [s for s in specs if s not in labels]
        return labels, ([(", ".join(others), "no certification bundle given for it")] if others else [])

    def why_not(self, backend, case):
        return self.certifier.why_not(backend.label, backend.availability().version, case)


class MeasuredFastest(Policy):
    """Every admitted contender, timed against the fast path at each shape class; kept per host on disk.

    ``cache``: a ``HostChoiceCache``, None (this process only) or "default" (``HostChoiceCache.default()``,
    resolved at the first use, so ``QCONFORM_DISPATCH_CACHE`` set after import still counts)."""

    name = "measured-fastest"
    timed = True
    chosen_how = "the only contender admitted"
    timed_label = "fastest measured on this host"

    def __init__(self, cache: HostChoiceCache | str | None = "default"):
        self._cache = cache

    @property
    def cache(self) -> HostChoiceCache | None:  # type: ignore[override]
        if self._cache == "default":
            self._cache = HostChoiceCache.default()
        return self._cache


class FallbackOnly(Policy):
    """No kernel at all: the fallback's fast path for every case (``why``: the reason, in every line)."""

    name = "fallback-only"

    def __init__(self, why: str):
        self.why = why
        self.none_admitted = why

    def contenders(self, specs):
        return [], ([(", ".join(specs), self.why)] if specs else [])


# --------------------------------------------------------------------------------------------- choice


@dataclasses.dataclass
class Choice:
    """The dispatcher's answer: the chosen backend, why each other one was skipped, and how it was chosen."""

    backend: Backend
    skipped: list[tuple[str, str]]
    how: str = ""
    times: dict[str, float] = dataclasses.field(default_factory=dict)  # label -> best seconds
    fallback: bool = False
    #: the chosen backend's output on the timing input (the first call's answer; never kept in a cache)
    output: object = dataclasses.field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        return f"Selection({self.backend.label}, skipped={self.skipped})"

    def skipped_text(self) -> str:
        """Each skipped backend with its reason, except those unavailable on this host (no library, no
        device), named together: their reasons do not depend on the layer (`qconform backends` says why)."""
        return _skipped_text(tuple(self.skipped))

    def line(self, case: Case) -> str:
        """The choice as the op logs it: what ran, how it was chosen, what was skipped and why."""
        chosen = self.backend.label
        if self.fallback:
            try:
                acc = _accumulation(self.backend, case)
            except TypeError:  # an unhashable backend object: asked directly
                acc = _accumulation.__wrapped__(self.backend, case)
            chosen = f"{chosen} fast path ({acc} accumulation; --backend emulator is the reference)"
        return f"{case.scheme} {case.weight_format} -> {chosen} [{self.how}] (skipped: {self.skipped_text()})"


@functools.lru_cache(maxsize=4096)
def _accumulation(backend: Backend, case: Case) -> str:
    """The fallback's declared accumulation, named in its choice line (a backend instance's declaration for a Case
    does not change: the dispatcher creates each spec once; formed once, not on every call)."""
    try:
        return backend.declared(case).accumulate
    except Exception:  # noqa: BLE001 - the line only
        return "declared"


@functools.lru_cache(maxsize=4096)
def _skipped_text(skipped: tuple) -> str:
    """``Choice.skipped_text`` of ``skipped`` ((name, why) pairs): formed once per distinct list, since the op
    forms a choice's line on every call."""
    away = [n for n, why in skipped if why.startswith("unavailable")]
    rest = [f"{n}: {why}" for n, why in skipped if not why.startswith("unavailable")]
    if away:
        rest.append(f"unavailable here: {', '.join(away)} (`qconform backends` says why)")
    return "; ".join(rest) or "none"


# --------------------------------------------------------------------------------------------- dispatcher


class Dispatcher:
    """Chooses a backend per case under ``policy`` (module docstring); one object holds all its state.

    ``registry``: where backends come from, an object with ``create(spec)`` and ``registered()`` (the module
    backends/registry.py, whose ``dispatcher()`` builds one: this module never imports it).
    ``candidates``: backend specs to consider (None: every registered backend); a spec naming the fallback
    is its instance. ``itself``: backend names that are dispatchers (never contenders)."""

    def __init__(self, policy: Policy | None = None, *, registry, candidates: list[str] | None = None,
                 allow_opaque: bool = False, fallback: str = "emulator", itself: tuple[str, ...] = ("auto",),
                 floor_db: float | None = None):
        self.registry = registry
        self.policy = policy or ByPriority()
        self.candidates = None if candidates is None else list(candidates)
        self.allow_opaque = allow_opaque
        self.fallback_name = fallback
        self.itself = frozenset(itself)
        self.floor_db = floor_db
        self._instances: dict[str, Backend | Exception] = {}
        self._admitted: dict = {}  # (layer, case) -> (contenders, skipped)
        self._declared: dict = {}  # (label, case) -> its declaration (judged on each call's activations)
        self._floor_met: dict = {}  # (layer, label) -> None (met floor_db on the layer's first input) or why not
        self._timed: dict = {}  # (class key, contender labels) -> (chosen label, times, how)
        self._failed: dict[str, dict[str, str]] = {}  # class key -> label -> why it failed when run
        self.notes: dict = {}  # layer -> the choice lines logged for it
        #: bumped whenever a choice may change (policy, floor, a new run, a failure): a caller that keeps a choice
        #: for its own shortcut keeps it only while this number stays the same
        self.generation = 0

    # -- state

    def set_policy(self, policy: Policy) -> None:
        """A new policy: every choice is made again (instances and failures are kept)."""
        self.policy = policy
        self.generation += 1
        self._admitted.clear()
        self._declared.clear()
        self._floor_met.clear()
        self._timed.clear()

    def clear(self) -> None:
        """Forget every choice, failure and note (a new run)."""
        self.generation += 1
        self._admitted.clear()
        self._declared.clear()
        self._floor_met.clear()
        self._timed.clear()
        self._failed.clear()
        self.notes.clear()

    def note(self, layer, line: str) -> bool:
        """Record a choice line for ``layer`` once per chosen backend; True where it is new (log it then)."""
        seen = self.notes.setdefault(layer, [])
        head = line.split(" [", 1)[0].split(" (", 1)[0]
        if any(l.split(" [", 1)[0].split(" (", 1)[0] == head for l in seen):
            return False
        seen.append(line)
        return True

    def instance(self, spec: str) -> Backend:
        """The backend of ``spec``, created once (a creation error is kept and raised again)."""
        got = self._instances.get(spec)
        if got is None:
            try:
                got = self.registry.create(spec)
            except Exception as e:  # noqa: BLE001 - unknown names / parameters: raised to the caller
                got = e
            self._instances[spec] = got
        if isinstance(got, Exception):
            raise got
        return got

    def fallback(self) -> Backend:
        spec = next((s for s in self.candidates or () if s.partition(":")[0].strip() == self.fallback_name),
                    self.fallback_name)
        return self.instance(spec)

    def fail(self, case: Case, label: str, why: str) -> None:
        """``label`` raised when run for ``case``: no longer a contender at its shape class."""
        self._failed.setdefault(_class_key(case), {})[label] = why
        self.generation += 1
        self._admitted.clear()
        self._timed = {k: v for k, v in self._timed.items() if k[0] != _class_key(case)}

    # -- choosing

    def _specs(self) -> list[str]:
        names = self.candidates if self.candidates is not None else list(self.registry.registered())
        return [s for s in names if s.partition(":")[0].strip() not in self.itself | {self.fallback_name}]

    def admissible(self, case: Case, tensors: dict | None = None,
                   activations=None) -> tuple[list[Backend], list[tuple[str, str]]]:
        """(the contenders for ``case``, highest priority first; (spec, why) of every other backend).

        ``activations``: the input [M, K] the choice is for; a contender whose activation quantizer is more than
        rounding on it is skipped (``activation_refusal``)."""
        admitted, skipped = self._admissible(case, tensors)
        return self._on_activations(case, admitted, skipped, activations)

    def _on_activations(self, case: Case, admitted: list[Backend], skipped: list, activations):
        """``admitted`` less the contenders ``activation_refusal`` refuses on ``activations`` (None: all kept)."""
        if activations is None:
            return admitted, skipped
        kept, skipped = [], list(skipped)
        for b in admitted:
            why = self._activation_why(case, b, activations)
            if why:
                skipped.append((b.label, why))
            else:
                kept.append(b)
        return kept, skipped

    def _admissible(self, case: Case, tensors: dict | None = None) -> tuple[list[Backend], list[tuple[str, str]]]:
        specs, skipped = self.policy.contenders(self._specs())
        skipped = list(skipped)
        failed = self._failed.get(_class_key(case), {})
        out = []
        for spec in specs:
            try:
                b = self.instance(spec)
            except Exception as e:  # noqa: BLE001 - named in the choice line, never hidden
                skipped.append((spec, f"cannot be created: {e}"))
                continue
            if b.name in self.itself or b.name == self.fallback_name:
                continue
            if b.label in failed:
                skipped.append((b.label, f"failed when run ({failed[b.label]})"))
                continue
            why = dispatch_refusal(b, case, self.allow_opaque, tensors) or self.policy.why_not(b, case)
            if why:
                skipped.append((b.label, why))
                continue
            out.append(b)
        out.sort(key=lambda b: -b.priority)
        return out, skipped

    def choose(self, case: Case, *, tensors=None, layer=None, timer=None, reference=None,
               activations=None) -> Choice:
        """The backend for ``case``.

        ``tensors``: the layer's tensors (a dict, or a callable returning it, called only when the
        contenders are not known yet for ``layer``) to judge tensor-dependent levels on; ``layer``: a
        hashable identity of the layer and its tensors (the contenders are kept per layer and case; without
        it they are kept per case only when no tensors are given). ``activations``: this call's input [M, K],
        on which each contender's activation quantizer is judged at every call (``activation_refusal``; never
        kept: the next input may differ). ``timer(backend, bound) -> (seconds, y)``
        runs a contender on the real input (timed policies; ``bound``: the best time so far, which a timer
        may use to stop repeating a contender already slower); ``reference() -> y`` for the ``floor_db`` gate."""
        akey = (layer, case) if layer is not None or tensors is None else None  # a Case is frozen: hashable
        got = self._admitted.get(akey) if akey is not None else None
        if got is None:
            got = self._admissible(case, tensors() if callable(tensors) else tensors)
            if akey is not None:
                self._admitted[akey] = got
        fb = self.fallback()
        quick = self._known_choice(case, got, fb, activations, timer)
        if quick is not None:  # (the floor gate runs the kernel: only where a timer is given)
            return quick if timer is None else self._floor_gate(case, quick, layer, timer, reference)
        # a timed policy whose class choice is not known (or is refused on these activations): measure
        admitted, skipped = self._on_activations(case, got[0], list(got[1]), activations)
        if not admitted:
            return self._logged(case, Choice(fb, skipped, self.policy.none_admitted, fallback=True))
        return self._floor_gate(case, self._measured(case, admitted + [fb], skipped, timer, reference, activations),
                                layer, timer, reference)

    def _known_choice(self, case: Case, got, fb: Backend, activations, timer) -> "Choice | None":
        """The choice where judging every contender's activation quantizer on this call cannot change it: untimed,
        the first admitted contender by priority that passes on ``activations`` (judged in turn; the fast path when
        none does); timed, the class's measured choice among all admitted contenders when it passes on
        ``activations`` (one judgement instead of one per contender: each runs two int8 quantizers over [M, K]).
        None: measure (every contender judged first)."""
        admitted, skipped = got[0], list(got[1])
        if not self.policy.timed or timer is None:
            for i, b in enumerate(admitted):
                why = activations is not None and self._activation_why(case, b, activations)
                if why:
                    skipped.append((b.label, why))
                    continue
                return self._logged(case, Choice(b, skipped + [(o.label, f"lower priority than {b.label}")
                                                              for o in admitted[i + 1:]],
                                                 ByPriority.chosen_how if timer is None and self.policy.timed
                                                 else self.policy.chosen_how))
            return self._logged(case, Choice(fb, skipped, self.policy.none_admitted, fallback=True))
        if activations is None or not admitted:
            return None
        by_label = {b.label: b for b in admitted + [fb]}
        hit = self._timed.get((_class_key(case), tuple(by_label)))
        if hit is None:
            return None
        label, times, how, gated = hit
        chosen = by_label[label]
        if chosen is not fb and self._activation_why(case, chosen, activations):
            return None  # the measured choice is refused on this input: judge all and measure what is left
        return Choice(chosen, skipped + gated, how, dict(times), fallback=chosen is fb)

    def _activation_why(self, case: Case, b: Backend, activations) -> "str | None":
        key = (b.label, case)
        declared = self._declared.get(key)
        if declared is None:
            declared = self._declared[key] = b.declared(case)
        return activation_refusal(declared, case, activations)

    def _floor_gate(self, case: Case, choice: Choice, layer, timer, reference) -> Choice:
        """With ``floor_db``: ``choice`` only where its kernel met the floor on this layer's own input.

        A timed choice is kept per shape class, so the layers after the first of a class reuse it without
        having been timed: each layer is checked on its first call (the kernel run once on its input, against
        its reference), and the answer kept per layer and kernel. A layer below the floor runs on the fast path.
        A choice measured on this very input (its ``output`` set) was gated there already."""
        if self.floor_db is None or reference is None or choice.fallback:
            return choice
        key = None if layer is None else (layer, choice.backend.label)
        if choice.output is not None:
            if key is not None:
                self._floor_met[key] = None
            return choice
        if key is not None and key in self._floor_met:
            why = self._floor_met[key]
        else:
            try:
                _, y = timer(choice.backend, 0.0)  # a bound of 0: the timer runs it no more than it must
            except Exception as e:  # noqa: BLE001 - a kernel that fails on this layer is not chosen for it
                why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                self.fail(case, choice.backend.label, why)
                why = f"failed when run on this layer ({why})"
            else:
                db = sqnr_db(y, reference())
                why = None if db >= self.floor_db else (
                    f"{db:.1f} dB against the reference on this layer's first input, below the {self.floor_db:g} dB "
                    "floor the model-level check asks")
                if why is None:
                    choice.output = y
            if key is not None:
                self._floor_met[key] = why
        if why is None:
            return choice
        return self._logged(case, Choice(self.fallback(), choice.skipped + [(choice.backend.label, why)],
                                         f"{choice.backend.label} is below the floor on this layer", fallback=True))

    def _logged(self, case: Case, choice: Choice) -> Choice:
        for name, why in choice.skipped:
            log.info("dispatch %s: skipped %s (%s)", case.describe(), name, why)
        if choice.fallback:
            log.info("dispatch %s: falling back to %s (%s)", case.describe(), choice.backend.label, choice.how)
        else:
            log.info("dispatch %s: selected %s (%s)", case.describe(), choice.backend.label, choice.how)
        return choice

    def _judgement_seconds(self, case: Case, b: Backend, activations) -> float:
        """What choosing ``b`` costs on every call besides its kernel: judging its activation quantizer on the
        call's input (``activation_refusal``; nothing for the fast path or without activations), best of 3."""
        if activations is None:
            return 0.0
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            self._activation_why(case, b, activations)
            best = min(best, time.perf_counter() - t0)
        return best

    def _measured(self, case: Case, contenders: list[Backend], skipped, timer, reference,
                  activations=None) -> Choice:
        fb = contenders[-1]
        labels = tuple(b.label for b in contenders)
        ckey = _class_key(case)
        by_label = {b.label: b for b in contenders}
        hit = self._timed.get((ckey, labels))
        if hit is not None:
            label, times, how, gated = hit
            return Choice(by_label[label], skipped + gated, how, dict(times), fallback=by_label[label] is fb)
        cache = self.policy.cache
        versions = {b.label: b.availability().version for b in contenders}
        hkey = f"{self.policy.name}|{ckey}|{'+'.join(labels)}|floor={self.floor_db}"
        if cache is not None:
            entry, why = cache.get(hkey, list(labels), versions)
            if why:
                log.warning("dispatch %s: %s", case.describe(), why)
            if entry is not None:
                times = {k: float(v) / 1e3 for k, v in entry["times_ms"].items()}
                how = self.policy.measured_how(case.M, times, from_cache=True)
                self._timed[(ckey, labels)] = (entry["chosen"], times, how, [])
                return self._logged(case, Choice(by_label[entry["chosen"]], skipped, how, times,
                                                 fallback=by_label[entry["chosen"]] is fb))
        times: dict[str, float] = {}
        outputs: dict[str, object] = {}
        gated: list[tuple[str, str]] = []
        ref = None
        for b in [fb] + contenders[:-1]:  # the fast path first: its time bounds the others' (``timer``)
            bound = min(times.values(), default=math.inf)
            try:
                secs, y = timer(b, bound)
            except Exception as e:  # noqa: BLE001 - a contender that fails is not chosen; the reason is logged
                why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                gated.append((b.label, f"failed when timed ({why})"))
                if b is not fb:
                    self._failed.setdefault(ckey, {})[b.label] = why
                continue
            if self.floor_db is not None and reference is not None and b is not fb:
                ref = reference() if ref is None else ref
                db = sqnr_db(y, ref)  # NaN or Inf where the reference is finite: -inf, gated
                if db < self.floor_db:
                    gated.append((b.label, f"{db:.1f} dB against the reference on this input, below the "
                                           f"{self.floor_db:g} dB floor the model-level check asks"))
                    continue
            # a kernel chosen here is judged on every call's activations: that cost is part of choosing it
            times[b.label] = secs + (0.0 if b is fb else self._judgement_seconds(case, b, activations))
            outputs[b.label] = y
        if not times:  # not even the fast path ran: the caller runs the reference
            return self._logged(case, Choice(fb, skipped + gated, "no contender ran", fallback=True))
        chosen = min(times, key=times.get)
        if chosen != fb.label and fb.label in times:  # a second round, the other way round: the fast path ran first,
            for b in (by_label[chosen], fb):  # beside what the model ran before; one noisy timing must not decide
                times[b.label] = min(times[b.label], timer(b, math.inf)[0] + self._judgement_seconds(case, b, activations if b is not fb else None))
            chosen = min(times, key=times.get)
        near = chosen != fb.label and fb.label in times and times[chosen] > (1 - FAST_PATH_MARGIN) * times[fb.label]
        if near:
            chosen = fb.label  # within the timing's noise of the fast path: the fast path
        how = self.policy.measured_how(case.M, times, from_cache=False) + (
            f"; none {FAST_PATH_MARGIN:.0%} faster than the fast path, which is kept" if near else "")
        self._timed[(ckey, labels)] = (chosen, dict(times), how, gated)
        if cache is not None and set(times) == set(labels):  # only a complete measurement is worth keeping
            cache.put(hkey, {"chosen": chosen, "times_ms": {k: v * 1e3 for k, v in times.items()},
                             "versions": versions, "case": case.describe()})
        return self._logged(case, Choice(by_label[chosen], skipped + gated, how, times,
                                         fallback=by_label[chosen] is fb, output=outputs[chosen]))

    def chosen_labels(self) -> set[str]:
        """The labels some measured shape class chose so far (a contender that lost every measurement is in none:
        the caller may drop what it prepared for the timing)."""
        return {v[0] for v in self._timed.values()}

    def named(self, spec: str, case: Case) -> Backend:
        """The backend the user named, or RuntimeError saying why it cannot take ``case`` (no dispatch rule
        applies: naming a backend is asking for it)."""
        b = self.instance(spec)
        av = b.availability()
        if not av.available:
            raise RuntimeError(f"backend {b.label} is unavailable here: {av.reason}")
        sup = b.can_implement(case)
        if not sup.ok:
            raise RuntimeError(f"backend {b.label} cannot implement {case.describe()}: {sup.reason}")
        return b
