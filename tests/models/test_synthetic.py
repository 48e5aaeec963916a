"""Synthetic targets (specdec.models.synthetic): random weights at a real model's shape, for costs only."""

import json
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from specdec import NgramDrafter, autoregressive_generate, speculative_generate
from specdec.models import CompactDecoder, as_decoder
from specdec.models.synthetic import MARK, SHAPES, is_synthetic, shape_config, synthetic_target

SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=256)


@pytest.mark.parametrize("shape, billions", [("llama-3.1-8b", 8.03), ("llama-3.2-1b", 1.24), ("qwen3-8b", 8.19)])
def test_the_presets_have_the_published_sizes(shape, billions):
    model = synthetic_target(shape, device="meta")  # shapes only: nothing allocated
    assert is_synthetic(model) and model.config.model_type == SHAPES[shape]["model_type"]
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.01)


def test_a_synthetic_target_runs_the_compact_decoder_and_stays_exact(tmp_path):
    """The same compact forward as a real target; greedy speculative decoding equals plain decoding on it too."""
    model = synthetic_target("llama-3.1-8b", dtype=torch.float32, **SMALL)
    assert isinstance(as_decoder(model), CompactDecoder)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3]])
    ref = autoregressive_generate(model, ids, max_new_tokens=12, eos_token_id=[])
    assert speculative_generate(model, NgramDrafter(), ids, k=3, max_new_tokens=12, eos_token_id=[]).sequences == \
        ref.sequences
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", **SMALL}))
    assert shape_config(str(tmp_path)).model_type == "qwen3" == shape_config(str(tmp_path / "config.json")).model_type


def test_a_shape_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="target.shape='llama-9b' is neither a preset"):
        shape_config("llama-9b")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        shape_config(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    with pytest.raises(ValueError, match="names no model_type"):
        shape_config(str(tmp_path))


def test_entry_points_that_report_outputs_refuse_it():
    from specdec.jobs.checks import check_target_choice

    cfg = OmegaConf.create({"target": {"name": "synthetic", "shape": "llama-3.2-1b"}})
    with pytest.raises(ValueError, match="target=synthetic .* costs only.*step_costs.py --shape llama-3.2-1b"):
        check_target_choice(cfg)


def test_step_costs_measures_a_curve_marked_synthetic(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from experiments.benchmarks import step_costs

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"model_type": "llama", **SMALL}))
    result = step_costs.main(["--shape", str(config), "--widths", "1", "4", "--batch", "1", "2", "--context", "16",
                              "--repeats", "1", "--out", str(tmp_path / "out")])
    assert result["mark"] == MARK and [(r["batch"], r["width"]) for r in result["rows"]] == [(1, 1), (1, 4), (2, 1),
                                                                                           (2, 4)]
    assert all(r["ms"] > 0 and r["floor_ms"] > 0 for r in result["rows"])
    written = json.loads((tmp_path / "out" / "step_costs_tiny.json").read_text())
    assert written["rows"] == result["rows"] and "SYNTHETIC" in (tmp_path / "out" / "step_costs_tiny.md").read_text()
    assert (tmp_path / "out" / "step_costs_tiny.png").stat().st_size > 0


def test_a_synthetic_target_over_codes_streams_them_and_says_so(tmp_path):
    """``weight_bits``: every layer's weights 4-bit codes, the embedding (the tied LM head) 8-bit, as
    ``cpu_kernels.pack_codes`` takes them back exactly; step_costs' floor counts the codes' bytes, its outputs say so.
    Only on a CPU in float32."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from experiments.benchmarks import step_costs
    from specdec.models import cpu_kernels

    model = synthetic_target("llama-3.2-1b", dtype=torch.float32, weight_bits=4, **SMALL)
    embedding = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is embedding  # the preset ties them
    kinds = {name: cpu_kernels.pack_codes(p.detach()).dtype for name, p in model.named_parameters() if p.dim() == 2}
    assert kinds.pop("model.embed_tokens.weight") == torch.int8 and set(kinds.values()) == {torch.uint8}, kinds
    with pytest.raises(ValueError, match="weight_bits=4 .* device='cpu' and dtype=torch.float32"):
        synthetic_target("llama-3.2-1b", dtype=torch.bfloat16, weight_bits=4, **SMALL)
    if not cpu_kernels.available():
        pytest.skip("specdec's CPU kernels are not built here: the floor over codes needs them")
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"model_type": "llama", **SMALL, "tie_word_embeddings": True}))
    runs = {bits: step_costs.main(["--shape", str(config), "--widths", "1", "--batch", "1", "--context", "16",
                                   "--repeats", "1", "--out", str(tmp_path / f"out{len(bits)}"), *bits])
            for bits in ((), ("--weight-bits", "4"))}
    floats, codes = (runs[bits]["rows"][0]["floor_ms"] for bits in runs)
    assert codes < 0.5 * floats  # 0.75 and 1.125 bytes a weight against float32's 4 (the KV cache the same)
    assert "4-bit codes" in (tmp_path / "out2" / "step_costs_tiny.md").read_text()


def test_step_costs_times_the_drafters_steps_at_the_targets_width(tmp_path, monkeypatch):
    """``--drafters``: EAGLE's tree levels, Medusa's heads, the block drafter's block, built at the shape's width
    with random weights, and a draft model's forwards at ``--draft-shape``, each a row of its own (JSON and table,
    the widths replay reads); a drafter that raises costs its own row, named; a draft model without a shape is
    refused naming the option."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from experiments.benchmarks import step_costs
    from specdec.drafters.dflash.model import DFlashModel
    from specdec.drafters.medusa.heads import MedusaHeads

    widths = []
    step = DFlashModel.draft_block
    monkeypatch.setattr(DFlashModel, "draft_block", lambda self, *a, **k: widths.append(self.cfg.hidden_size) or
                        step(self, *a, **k))
    config, small = tmp_path / "tiny.json", tmp_path / "draft.json"
    config.write_text(json.dumps({"model_type": "llama", **SMALL, "num_hidden_layers": 4}))
    small.write_text(json.dumps({"model_type": "llama", **SMALL, "num_hidden_layers": 1}))
    args = ["--shape", str(config), "--widths", "1", "--batch", "1", "--context", "16", "--repeats", "1",
            "--draft-vocab", "64", "--drafters", *step_costs.DRAFTERS]
    with pytest.raises(SystemExit):
        step_costs.main([*args, "--out", str(tmp_path / "out")])
    args += ["--draft-shape", str(small), "--draft-model-vocab", "32"]
    built = []
    make = step_costs.synthetic_target
    monkeypatch.setattr(step_costs, "synthetic_target",
                        lambda shape, **kw: built.append((shape, kw)) or make(shape, **kw))
    result = step_costs.main([*args, "--out", str(tmp_path / "out")])
    assert [(shape, kw.get("vocab_size")) for shape, kw in built] == [(str(config), None), (str(small), 32)]
    rows = result["drafter_rows"]
    nodes = list(step_costs.EAGLE_WIDTHS)
    assert [(r["drafter"], r["width"]) for r in rows] == ([("eagle", w) for w in nodes] + [("medusa", None),
                                                          ("dflash", None)] + [("draft_model", w) for w in nodes])
    assert all(r["ms"] > 0 for r in rows) and set(widths) == {SMALL["hidden_size"]}
    table = (tmp_path / "out" / "step_costs_tiny.md").read_text()
    assert "| medusa | 4 heads over the target's LM head rows | 1 |" in table and "failed" not in table
    assert f"| draft_model | {small} over 4 tokens | 1 |" in table
    curve = tmp_path / "curve"  # --into: a curve measured in one step, the drafters in another, one file for replay
    target = ["--shape", str(config), "--batch", "1", "--repeats", "1"]
    measured = step_costs.main([*target, "--widths", "1", "2", "--context", "16", "--out", str(curve)])
    medusa = [*target, "--widths", "1", "--drafters", "medusa", "--into", str(curve / "step_costs_tiny.json")]
    joined = step_costs.main([*medusa, "--context", "16", "--out", str(tmp_path / "joined")])
    assert joined["rows"] == measured["rows"] and [r["drafter"] for r in joined["drafter_rows"]] == ["medusa"]
    with pytest.raises(SystemExit, match="context"):
        step_costs.main([*medusa, "--context", "32", "--out", str(tmp_path / "other")])

    def broken(self, *a, **k):
        raise RuntimeError("planted")
    monkeypatch.setattr(MedusaHeads, "forward", broken)
    rows = step_costs.main([*args, "--out", str(tmp_path / "out2")])["drafter_rows"]
    medusa, = [r for r in rows if r["drafter"] == "medusa"]
    assert "ms" not in medusa and medusa["error"] == "RuntimeError: planted"
    assert all("ms" in r for r in rows if r["drafter"] != "medusa")
    assert "| medusa | 4 heads over the target's LM head rows | 1 | failed: RuntimeError: planted" in \
        (tmp_path / "out2" / "step_costs_tiny.md").read_text()


@pytest.mark.gpu
def test_step_costs_replays_the_drafters_steps_as_cuda_graphs(tmp_path):
    """On a GPU each drafter's step is captured and replayed (bf16, Triton kernels): every row measured, none failed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from experiments.benchmarks import step_costs

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"model_type": "llama", **SMALL, "num_hidden_layers": 4}))
    result = step_costs.main(["--shape", str(config), "--widths", "1", "4", "--batch", "1", "8", "--context", "16",
                              "--repeats", "3", "--draft-vocab", "64", "--drafters", *step_costs.DRAFTERS,
                              "--draft-shape", str(config), "--out", str(tmp_path / "out")])
    assert result["drafter_rows"] and all(r.get("ms", 0) > 0 for r in result["drafter_rows"]), result["drafter_rows"]
