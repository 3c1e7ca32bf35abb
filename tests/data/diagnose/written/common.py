"""Helpers for the hand-written cases: each wN.py writes one cases/<name>/ from
templates of the log formats of one torch version (see its expected.json
origin), with a fixed random seed, so rerunning gives the same bytes.

    python3 tests/data/diagnose/written/w3.py
"""
import json, os, random
from pathlib import Path
CASES = Path(__file__).resolve().parents[1] / "cases"

def write(name, files, expected):
    d = CASES / name
    d.mkdir(parents=True, exist_ok=True)
    for fn, text in files.items():
        p = d / fn
        p.parent.mkdir(parents=True, exist_ok=True)
        if fn.endswith(".gz"):
            import gzip
            p.write_bytes(gzip.compress(text.encode(), mtime=0))
        else:
            p.write_text(text)
    import re
    text = json.dumps(expected, indent=2)
    text = re.sub(r"\[\s*([0-9,\s]*?)\s*\]", lambda m: "[" + ", ".join(re.findall(r"\d+", m.group(1))) + "]", text)
    (d / "expected.json").write_text(text + "\n")

def lineno(text, needle, start=1):
    for i, l in enumerate(text.splitlines(), 1):
        if i >= start and needle in l:
            return i
    raise SystemExit(f"needle not found: {needle!r}")

def frames_cpp(rng, lib, items):
    """items: list of (symbol, offset) -> 'frame #i: sym + off (0xaddr in lib)'"""
    out = []
    base = rng.randrange(0x7f0000000000, 0x7fffffffffff) & ~0xfff
    for i, (sym, off, l) in enumerate(items):
        out.append(f"frame #{i}: {sym} + {off} (0x{base + rng.randrange(0, 1<<24):x} in {l or lib})")
    return out
