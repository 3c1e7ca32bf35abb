"""Write the mangled twins of the public corpus: each public log as terminals and forums leave it.

    .venv/bin/python tests/data/diagnose/make_twins.py

For every case under public/ and every twin of tests/harness/mangle.py's TWINS
(wrapped at 80 and at 120 columns, glued to a redrawn progress bar, coloured,
quoted as Markdown with its indent lost and its HTML entities kept), writes
twins/<twin>/<case>/ : the case's files through that twin's rows of the one
table of transformations, with a seed of the case and twin's names, and an
expected.json holding the original's verdict (the same class and ranks) and
what made the twin. tests/unit/test_logstream_mangled.py checks that the files are
what this script writes and that ``diagnose`` gives each twin its original's
verdict. Deterministic: rerunning it rewrites the same bytes.
"""

from __future__ import annotations

import json
import shutil
import sys
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PUBLIC = HERE / "public"
TWINS_DIR = HERE / "twins"
#: The verdict keys a twin keeps from its original's expected.json.
VERDICT_KEYS = ("class", "initiating_ranks", "initiator_among", "collateral_ranks")

sys.path.insert(0, str(ROOT))
from tests.harness.mangle import TWINS, mangle  # noqa: E402


def seed(case: str, twin: str) -> int:
    return zlib.crc32(f"{case}/{twin}".encode())


def inputs(case: Path) -> list[Path]:
    return sorted(p for p in case.rglob("*") if p.is_file() and p.name != "expected.json")


def twin_text(data: bytes, twin: str, case: str) -> bytes:
    """A file of ``case`` as ``twin`` leaves it (bytes kept: undecodable ones survive)."""
    text = data.decode("utf-8", "surrogateescape")
    return mangle(text, TWINS[twin], seed(case, twin)).encode("utf-8", "surrogateescape")


def expected(case: Path, twin: str) -> dict:
    want = json.loads((case / "expected.json").read_text())
    out = {k: want[k] for k in VERDICT_KEYS if k in want}
    out["twin_of"] = f"public/{case.name}"
    out["twin"] = twin
    out["rows"] = list(TWINS[twin])
    out["seed"] = seed(case.name, twin)
    return out


def write_all() -> int:
    cases = sorted(p.parent for p in PUBLIC.glob("*/expected.json"))
    if TWINS_DIR.exists():
        shutil.rmtree(TWINS_DIR)
    n = 0
    for twin in TWINS:
        for case in cases:
            dst = TWINS_DIR / twin / case.name
            for src in inputs(case):
                out = dst / src.relative_to(case)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(twin_text(src.read_bytes(), twin, case.name))
            (dst / "expected.json").write_text(json.dumps(expected(case, twin), indent=2,
                                                          ensure_ascii=False) + "\n")
            n += 1
    return n


if __name__ == "__main__":
    print(f"{write_all()} twins under {TWINS_DIR.relative_to(ROOT)}")
