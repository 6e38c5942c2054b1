"""The benchmark tools' own logic, without running a benchmark."""

import json


def test_the_grid_headline_names_the_smallest_ratio_per_regime_and_is_written(tmp_path, load_tool):
    """``bench_llm_grpo --grid``: the headline is the smallest tokens-per-CPU-second ratio,
    names ``min_full_length_ratio`` and ``min_natural_ratio``, and the common-shape writer
    keeps those keys after the five it requires (a grid run once lost an hour's results to
    a writer that refused them)."""
    bench, benchlib = load_tool("bench_llm_grpo"), load_tool("benchlib")

    def cell(name, full, tok, rss):
        ratio = {"cell": name, "full_length": full, "cpu_tok_s": tok, "peak_rss_mib": rss}
        return {"ratio": ratio}

    cells = [cell("natural8_g8", False, 2.1, 0.9), cell("full128_g8", True, 1.2, 1.01),
             cell("full512_g8", True, 1.3, 0.98)]  # fmt: skip
    head = bench.grid_headline(cells)
    assert (head["ratio"], head["worst_cell"]) == (1.2, "full128_g8")
    assert (head["min_full_length_ratio"], head["min_natural_ratio"]) == (1.2, 2.1)
    assert head["max_peak_rss_ratio"] == 1.01
    out = benchlib.write_result(tmp_path / "g.json", name="g", catalog_ids=[], config={},
                                seeds=[0], rows=[], headline=head)  # fmt: skip
    written = json.loads(out.read_text())["headline"]
    assert list(written)[:5] == list(benchlib.HEADLINE_KEYS)
    assert written["min_full_length_ratio"] == 1.2


def test_the_doc_number_check_finds_what_a_cited_file_does_not_hold(tmp_path, load_tool):
    """``tools/check_doc_numbers.py``: a number in a citing section's prose is backed when a
    cited file holds it at the decimals shown (or as a fraction of a percentage); code
    blocks and sections that cite nothing are not read."""
    mod = load_tool("check_doc_numbers")
    results = tmp_path / "results"
    results.mkdir()
    (results / "r.json").write_text(json.dumps({"rows": [{"acc": 0.35546875, "share": 0.125}]}))
    page = tmp_path / "p.md"
    page.write_text(
        "# A\n\nFrom `docs/results/r.json`: 0.355, 12.5 %, and 0.356.\n\n```\n9.99\n```\n\n"
        "# B\n\nNo citation here: 0.777.\n"
    )
    assert mod.unbacked(page, results) == [("# A", ["0.356"])]


def test_the_step_floor_counts_every_weight_and_each_key_value_read_by_hand(load_tool, monkeypatch):
    """``tools/floor_llm_grpo.py``: its weight matrices are the decoder layer's own (the
    decode's concatenated ones too), and the decode's key / value reads are, per row, step
    t reading its p + t + 1 cached tokens: by hand, 2 rows of p = 2 prompt and l = 3
    generated tokens read 3 + 4 + 5 = 12 tokens each, 2,048 bytes a token (4 layers x keys
    and values x 2 heads x 32 dims x 4 bytes); a cell whose TRL side is missing is left
    out."""
    import torch
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny

    floor = load_tool("floor_llm_grpo")
    cfg = tiny.tiny_config(tiny.build_tokenizer())
    layer = Qwen2ForCausalLM(cfg).model.layers[0]
    own = sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    decode, update = floor.weight_shapes(cfg)
    assert sum(o * i for o, i in update) == sum(o * i for o, i in decode) == own
    monkeypatch.setattr(floor, "products_s", lambda *a, **k: 0.0)
    monkeypatch.setattr(floor, "attention_s", lambda *a, **k: 0.0)
    cell = {"prompts": 1, "group_size": 2, "gen_tokens_per_step": 6}
    parts = floor.cell_floor(cfg, cell, p=2, rate=1.0, repeats=1)
    assert parts["rollout_kv_ms"] == 1e3 * 2 * 2048 * 12 == parts["floor_ms"]
    mean = {"seed": "mean", "gen_tokens_per_step": 6, "cpu_ms": 10.0, "cpu_tok_s": 1.5,
            "rollout_ms": 4.0, "update_ms": 6.0}  # fmt: skip
    grid = {
        "config": {"cells": [{"name": "a"}, {"name": "b"}]},
        "rows": [{**mean, "cell": "a", "side": s} for s in ("rlpost", "trl", "rlpost/TRL")]
        + [{**mean, "cell": "b", "side": "rlpost"}],
    }
    assert [c["name"] for c in floor.grid_cells(grid)] == ["a"]


def test_the_floor_figure_redraws_from_a_result_without_timing(tmp_path, load_tool, monkeypatch):
    """``floor_llm_grpo.py --replot R --plot P`` draws the figure from a committed result
    and times nothing; ``--replot`` without ``--plot`` is a one-line error."""
    import sys

    import pytest

    floor = load_tool("floor_llm_grpo")
    row = {"cell": "full8_g8", "rlpost_over_floor": 1.5, "trl_over_floor": 2.5}
    result = tmp_path / "floor.json"
    result.write_text(json.dumps({"rows": [row]}))
    monkeypatch.setattr(floor, "cell_floor", lambda *a, **k: pytest.fail("timed something"))
    png = tmp_path / "f.png"
    monkeypatch.setattr(sys, "argv", ["floor", "--replot", str(result), "--plot", str(png)])
    floor.main()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setattr(sys, "argv", ["floor", "--replot", str(result)])
    with pytest.raises(SystemExit, match="needs --plot"):
        floor.main()
