"""This host's CPU as /proc/cpuinfo gives it: one reader for the adapters' ISA keys and the dispatch cache's host
identity (no library is imported)."""

from __future__ import annotations

import platform

__all__ = ["cpu_info"]


def cpu_info() -> dict:
    """vendor, model name, family/model and the flag set of the first CPU of /proc/cpuinfo (``Features`` on Arm);
    empty fields where unreadable."""
    info = {"vendor": "", "model_name": platform.processor() or "", "family": None, "model": None, "flags": set()}
    named = False
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "vendor_id" and not info["vendor"]:
                    info["vendor"] = val
                elif key == "model name" and not named:
                    info["model_name"], named = val, True
                elif key == "cpu family" and info["family"] is None:
                    info["family"] = int(val)
                elif key == "model" and info["model"] is None and val.isdigit():
                    info["model"] = int(val)
                elif key in ("flags", "Features") and not info["flags"]:
                    info["flags"] = set(val.split())
    except OSError:
        pass
    return info
