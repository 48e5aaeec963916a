"""The speed-of-light figures of a run: bytes a step reads, the machine's read bandwidth (probed once, cached)."""

import json

import pytest
import torch

from conftest import tiny_llama

from specdec import speed_of_light as sol


def test_step_bytes_counts_each_weight_once_and_the_kv_cache():
    model = tiny_llama(layers=2, seed=0)  # tied embeddings: the LM head is the embedding matrix
    weights = sum(p.numel() * 4 for p in model.parameters())  # parameters() already yields a shared one once
    cfg = model.config
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert sol.step_bytes(model, context=10, batch=3) == weights + 30 * per_position


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
