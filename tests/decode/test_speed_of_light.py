"""The speed-of-light figures of a run: bytes a step reads, the machine's read bandwidth (probed once, cached)."""

import json

import pytest
import torch
from helpers import coded_weight, tiny_llama

from specdec.decode import speed_of_light as sol


def test_step_bytes_counts_each_weight_once_and_the_kv_cache():
    model = tiny_llama(layers=2, seed=0)  # tied embeddings: the LM head is the embedding matrix
    weights = sum(p.numel() * 4 for p in model.parameters())  # parameters() already yields a shared one once
    cfg = model.config
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert sol.step_bytes(model, context=10, batch=3) == weights + 30 * per_position


@torch.no_grad()
def test_step_bytes_counts_the_panels_a_weight_is_streamed_from():
    """A weight the CPU kernel reads from coded panels counts as those panels' bytes (0.75 a weight for 4-bit
    codes, 1.125 for 8-bit), the rest as their float32 bytes."""
    from specdec.models import Backend, as_decoder, cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("specdec's CPU kernel is not built here")
    model = tiny_llama(layers=2, seed=0)
    linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    for name, module in linears.items():
        module.weight.copy_(coded_weight(tuple(module.weight.shape), 8 if name == "lm_head" else 4, seed=len(name)))
    decoder = as_decoder(model)
    decoder(torch.tensor([[3, 4]]), decoder.new_cache(1, 8, torch.zeros(1, dtype=torch.long)))  # packs the panels
    coded = {id(m.weight): m.weight.numel() * (1.125 if name == "lm_head" else 0.75) for name, m in linears.items()}
    expected = sum(coded.get(id(p), p.numel() * 4) for p in model.parameters())
    assert sol.step_bytes(model, context=0) == pytest.approx(expected)
    assert expected < sum(p.numel() * 4 for p in model.parameters()) / 3
    as_float = sol.step_bytes(model, context=0, backend=Backend(weights="float"))  # a backend streaming float32
    assert as_float == sum(p.numel() * 4 for p in model.parameters())


def test_read_bandwidth_is_probed_once_per_machine_and_survives_a_corrupt_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(sol, "probe_read_bandwidth", lambda device: calls.append(device) or 2.5e10)
    (tmp_path / "bandwidth.json").write_text("{not json")
    assert sol.read_bandwidth("cpu") == 2.5e10 and sol.read_bandwidth("cpu") == 2.5e10
    assert len(calls) == 1
    assert list(json.loads((tmp_path / "bandwidth.json").read_text()).values()) == [2.5e10]


def test_the_probe_measures_a_plausible_bandwidth():
    assert 1e8 < sol.probe_read_bandwidth("cpu", num_bytes=32 * 2**20, repeats=2) < 1e13


def test_speed_of_light_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(sol, "probe_read_bandwidth", lambda device: 1e9)
    model = tiny_llama(layers=1)
    out = sol.speed_of_light(model, context=4, batch=1, plain_step_s=0.01, verify_step_s=0.02, device="cpu")
    floor = sol.step_bytes(model, 4) / 1e9
    assert out["bandwidth_floor_s"] == pytest.approx(floor)
    assert out["bandwidth_fraction"] == pytest.approx(floor / 0.01)
    assert out["bandwidth_fraction_verify"] == pytest.approx(floor / 0.02)
    assert out["read_bandwidth_GBps"] == pytest.approx(1.0)


def test_a_step_faster_than_the_cached_bandwidth_probes_again_and_keeps_the_higher(tmp_path, monkeypatch):
    """A bandwidth cached from a busy moment (a plain step read its bytes faster than it allows) is probed
    again; the higher of the probe and the step's rate is kept, so the plain fraction is at most 1."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    probes = iter([1e9, 2e9, 5e9])
    monkeypatch.setattr(sol, "probe_read_bandwidth", lambda device: next(probes))
    model = tiny_llama(layers=1)
    num_bytes = sol.step_bytes(model, 4)
    assert sol.read_bandwidth("cpu") == 1e9  # the first probe, cached
    out = sol.speed_of_light(model, context=4, batch=1, plain_step_s=num_bytes / 3e9, verify_step_s=num_bytes / 2e9,
                             device="cpu")  # the plain step read at 3 GB/s: the probe again says 2: 3 is kept
    assert out["read_bandwidth_GBps"] == pytest.approx(3.0)
    assert out["bandwidth_fraction"] == pytest.approx(1.0) and out["bandwidth_fraction_verify"] == pytest.approx(2 / 3)
    assert sol.read_bandwidth("cpu") == pytest.approx(3e9)  # cached
    out = sol.speed_of_light(model, context=4, batch=1, plain_step_s=num_bytes / 4e9, verify_step_s=num_bytes / 2e9,
                             device="cpu")  # faster again: the probe now says 5
    assert out["read_bandwidth_GBps"] == pytest.approx(5.0) and out["bandwidth_fraction"] == pytest.approx(0.8)
    out = sol.speed_of_light(model, context=4, batch=1, plain_step_s=num_bytes / 1e9, verify_step_s=num_bytes / 1e9,
                             device="cpu")  # slower: the cache stands (no probe left to take)
    assert out["read_bandwidth_GBps"] == pytest.approx(5.0)
