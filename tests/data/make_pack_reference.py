"""Record tests/data/pack-reference.json: the sha256 of every file of the packs that
`tests/reftree.py`'s scenarios give. Run once, with the pack code whose bytes are the
reference (it was run at commit 9cd7d7e, before the streaming pack of issue 11, and again
at formats 5 and 6, which changed the manifests only: every index and partition digest
stayed):

    .venv/bin/python tests/data/make_pack_reference.py

Never rerun it to make a failing byte-identity test pass: a different digest means the pack
format's bytes changed, which needs a FORMAT_VERSION bump (docs/format.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from tests.reftree import SCENARIOS, build_reference_tree, pack_digests  # noqa: E402


def main() -> None:
    out: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        build_reference_tree(src)
        for name, args in SCENARIOS.items():
            pack = Path(tmp) / name
            # Shared chunks (equal bytes stored once) came after the reference: it records
            # the packs written with every chunk stored (test_pack_stream checks the default).
            cmd = [
                *(sys.executable, "-m", "fanfs", "pack", str(src), str(pack), "-q"),
                *(*args, "--no-dedup", "--index-codec", "none"),
            ]
            subprocess.run(cmd, check=True)
            out[name] = pack_digests(pack, with_manifest=not name.startswith("auto"))
    (HERE / "pack-reference.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
