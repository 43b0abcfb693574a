"""What a case of the suite is: its tier and profile vocabulary and ``CaseSpec`` (case, tier, generator, seed).

Semantics: docs/conformance.md#cases. A leaf of the suite: the case list (conformance/cases/suite.py), the
golden set (conformance/cases/golden.py) and the name checks (conformance/cases/selection.py) all build on it.
"""

from __future__ import annotations

import dataclasses
import os
from importlib import resources
from pathlib import Path

from backends.base import Case

from conformance.cases.coverage_values import VALUE_GENERATORS
from conformance.cases.generators import GENERATORS, generate

# the coverage design's value-class generators (docs/conformance.md#coverage): every case id names a
# generator of this table, so they join it wherever a case spec can be read
GENERATORS.update(VALUE_GENERATORS)

__all__ = ["TIERS", "PROPERTY_TIER", "PROFILES", "CaseSpec", "GOLDEN_DIR", "MANIFEST", "golden_dir", "golden_inputs"]

TIERS = ("exact", "edge", "random", "golden")
#: the Hypothesis tier (conformance/cases/property.py): a search, not a case list; never a default tier
PROPERTY_TIER = "property"

#: profile -> knobs. ci: derandomised, bounded, reproducible. nightly: fresh seeds, more shapes and seeds.
#: ``coverage``: the seeds of the covering designs over the feature tables whose cases the profile adds
#: (conformance/cases/coverage.py; docs/conformance.md#coverage)
PROFILES = {
    "smoke": {"seeds": 1, "shapes": [(1, 64, 128), (5, 96, 256)], "fresh_seeds": False},
    "ci": {"seeds": 2, "shapes": [(1, 64, 128), (5, 96, 256), (16, 72, 128), (24, 64, 128)], "fresh_seeds": False,
           "coverage": (0,)},
    "certification": {"seeds": 3, "shapes": [(1, 64, 128), (5, 96, 256), (16, 72, 128), (33, 256, 512)],
                      "fresh_seeds": False, "coverage": (0, 1)},
    "nightly": {"seeds": 6, "shapes": [(1, 64, 128), (5, 96, 256), (16, 72, 128), (33, 256, 512), (128, 512, 1024)],
                "fresh_seeds": True, "coverage": (0, 1, 2)},
    # real layer shapes (Llama-3-8B, Qwen1.5-MoE, gpt-oss-20b) at M = 1, 16, 128, 512: its own case list
    # (conformance/cases/model_profile.py), no golden files, a per-case time limit for layer sizes on a loaded
    # 2-core host (the exact MoE reference at M = 512); docs/conformance.md#model-profile
    "model": {"seeds": 1, "shapes": [], "fresh_seeds": False, "cases": "model", "golden": False, "timeout": 900.0},
    # the case families a checkpoint's layers need (``qconform certify --for-model CKPT``): each family at
    # these shapes (K widened to the family's group), every generator of the tiers; the families travel
    # with the bundle (bundle.json) so the list can be re-derived; docs/certification.md#families
    "families": {"seeds": 2, "shapes": [(1, 64, 128), (5, 96, 256)], "fresh_seeds": False, "cases": "families",
                 "golden": False},
}


@dataclasses.dataclass(frozen=True)
class CaseSpec:
    case: Case
    tier: str
    generator: str
    seed: int

    @property
    def case_id(self) -> str:
        c = self.case
        flags = "sym" if c.sym else "asym"
        if c.act_order:
            flags += "-ao"
        if c.zero_convention:
            flags += f"-{c.zero_convention}"
        if c.bias:
            flags += "-bias"
        moe = f"-E{c.E}k{c.top_k}" if c.E else ""
        return (f"{self.tier}/{c.scheme}/{c.weight_format}/{self.generator}/"
                f"M{c.M}N{c.N}K{c.K}g{c.group_size}{moe}-{flags}-x{c.act_dtype}-s{c.scale_dtype}/seed{self.seed}")

    def to_json(self) -> dict:
        return {"case": self.case.to_json(), "tier": self.tier, "generator": self.generator, "seed": self.seed,
                "case_id": self.case_id}

    @classmethod
    def from_json(cls, d: dict) -> "CaseSpec":
        return cls(Case(**d["case"]), d["tier"], d["generator"], int(d["seed"]))

    def inputs(self):
        if self.tier == "golden":
            return golden_inputs(self)
        return generate(self.case, self.generator, self.seed)



def golden_dir() -> Path:
    """QCONFORM_GOLDEN_DIR, else the top-level data package ``golden/`` (found through importlib.resources, so an
    installed copy and an editable checkout read the same files). Never a folder relative to the cwd:
    a missing golden set is an error (``golden_specs``), not fewer cases."""
    if os.environ.get("QCONFORM_GOLDEN_DIR"):
        return Path(os.environ["QCONFORM_GOLDEN_DIR"])
    return Path(str(resources.files("golden")))


GOLDEN_DIR = golden_dir()
MANIFEST = "MANIFEST.json"


def golden_inputs(spec: CaseSpec, folder: "str | Path" = GOLDEN_DIR):
    from conformance.cases.bundle import load_bundle_inputs

    inp, _ = load_bundle_inputs(Path(folder) / (spec.generator + ".safetensors"))
    return inp
