"""experiments/gpu/kit.py: the target travels to a GPU machine as its block codes and comes back bit for bit;
a part that does not is refused, nothing written. Synthetic weights of the GGUF forms (Q4_1 layers, a Q8_0
embedding), float values that fit none, a norm vector."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "gpu"))
import kit  # noqa: E402


def q4_1(n: int, k: int, seed: int) -> torch.Tensor:
    """Values as a Q4_1 GGUF tensor dequantises: per block of 32, float16 scale · code (0..15) + float16 min."""
    g = torch.Generator().manual_seed(seed)
    scale = (torch.rand(n, k // 32, 1, generator=g) * 0.01 + 1e-3).half().float()
    low = (torch.randn(n, k // 32, 1, generator=g) * 0.05).half().float()
    codes = torch.randint(0, 16, (n, k // 32, 32), generator=g).float()
    codes[..., 0], codes[..., 1] = 0, 15  # the full range, as a quantiser uses it: the minimum is the offset
    return (scale * codes + low).reshape(n, k)


def q8_0(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = (torch.rand(n, k // 32, 1, generator=g) * 0.01 + 1e-3).half().float()
    codes = torch.randint(-127, 128, (n, k // 32, 32), generator=g).float()
    codes[..., 0] = 127  # the block's largest magnitude sets its scale
    return (scale * codes).reshape(n, k)


def weights() -> dict[str, torch.Tensor]:
    return {"layer.q.weight": q4_1(40, 96, 0), "embed.weight": q8_0(70, 64, 1),
            "layer.float.weight": torch.randn(8, 64, generator=torch.Generator().manual_seed(2)),
            "norm.weight": torch.rand(96, generator=torch.Generator().manual_seed(3))}


def test_each_form_comes_back_bit_for_bit():
    expected = {"layer.q.weight": "codes4", "embed.weight": "codes8", "layer.float.weight": "raw", "norm.weight": "raw"}
    for name, weight in weights().items():
        form, stored = kit.encode(name, weight)
        assert form == expected[name], name
        back = kit.decode(form, stored, weight.shape)
        assert torch.equal(back.view(torch.int32), weight.view(torch.int32)), name
        if form != "raw":
            assert sum(t.numel() * t.element_size() for t in stored.values()) < weight.numel() * 4 / 3


def test_unpack_rebuilds_the_directory_and_refuses_a_damaged_part(tmp_path, monkeypatch):
    source = tmp_path / "model"
    source.mkdir()
    tensors = weights()
    save_file(tensors, str(source / "model.safetensors"))
    (source / "config.json").write_text("{}")
    monkeypatch.setattr("specdec.models.loading.ensure_smollm2_cache", lambda: source)
    monkeypatch.setattr(kit.subprocess, "run", lambda *args, **kwargs: None)  # the prompts' dump: not here
    kit.pack(SimpleNamespace(out=str(tmp_path / "kit"), part_mib=0.004, no_wheels=True))
    parts = sorted(p.name for p in (tmp_path / "kit").glob("target-*"))
    assert len(parts) > 1  # split by size
    out = tmp_path / "cache" / "model"
    kit.unpack(SimpleNamespace(kit=str(tmp_path / "kit"), to=str(out)))
    rebuilt = load_file(str(out / "model.safetensors"))
    assert rebuilt.keys() == tensors.keys() and (out / "config.json").read_text() == "{}"
    assert all(torch.equal(rebuilt[n].view(torch.int32), t.view(torch.int32)) for n, t in tensors.items())

    manifest = json.loads((tmp_path / "kit" / "target-1" / "manifest.json").read_text())
    part = manifest["tensors"]["layer.q.weight"]["part"]
    path = tmp_path / "kit" / f"target-{part}" / "part.safetensors"
    stored = load_file(str(path))
    stored["layer.q.weight::codes"][0, 0] ^= 1  # one code changed
    save_file(stored, str(path))
    with pytest.raises(SystemExit, match="layer.q.weight did not rebuild bit for bit"):
        kit.unpack(SimpleNamespace(kit=str(tmp_path / "kit"), to=str(tmp_path / "other")))
    assert not (tmp_path / "other").exists()
    (tmp_path / "kit" / f"target-{len(parts)}" / "part.safetensors").unlink()
    with pytest.raises(SystemExit, match=f"parts \\[{len(parts)}\\] are not under"):
        kit.unpack(SimpleNamespace(kit=str(tmp_path / "kit"), to=str(tmp_path / "other")))
