"""Write the search environment's corpus as JSONL, one ``{"id", "text"}`` document a line::

python -m rlpost.llm.data.envs.search_corpus --out corpus.jsonl [--seed 0]
"""

from __future__ import annotations

import json
from pathlib import Path

from rlpost.llm.data.envs.search import build_corpus


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="write the search environment's corpus (JSONL)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    docs = build_corpus(a.seed)
    Path(a.out).write_text(
        "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs))
    )
    print(f"wrote {len(docs)} documents to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
