"""experiments/gpu/kit.py: the target travels to a GPU machine as its block codes and comes back bit for bit;
a part that does not is refused, nothing written. Synthetic weights of the GGUF forms (Q4_1 layers, a Q8_0
embedding), float values that fit none, a norm vector. The training's prompts travel as files, its results come
back as a bundle of parts checked bit for bit, and experiments/gpu/train.sh runs, stops at its limit and resumes
from the bundle it handed back, on a tiny target on CPU."""

from __future__ import annotations

import json
import os
import subprocess
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
    kit.pack(SimpleNamespace(out=str(tmp_path / "kit"), part_mib=0.004, no_wheels=True, train_prompts=3))
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
    prompts = [json.loads(line) for line in (tmp_path / "kit" / "train" / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 3 and all(row["text"] for row in prompts)  # the training's prompts travel as a file
    assert {p.name for p in (tmp_path / "kit" / "train" / "held_out").iterdir()} == {
        "mtbench.jsonl", "humaneval.jsonl", "wikipedia.jsonl"}


def bundle_folder(root: Path) -> Path:
    folder = root / "run"
    (folder / "checkpoints" / "step-3").mkdir(parents=True)
    (folder / "checkpoints" / "step-3" / "model.safetensors").write_bytes(os.urandom(5000))
    (folder / "checkpoints" / "latest").write_text("step-3")
    (folder / "console.log").write_text("trained\n")
    (folder / "data.safetensors").write_bytes(os.urandom(3000))
    return folder


def test_a_split_folder_joins_bit_for_bit_and_a_damaged_part_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(kit, "PART_BYTES", 15 * 1024)  # parts of 15 KiB: several
    folder = bundle_folder(tmp_path)
    (folder / "big").write_bytes(os.urandom(40_000))
    kit.split(SimpleNamespace(folder=str(folder), out=str(tmp_path / "out"), name="medusa", exclude=["data.safetensors"]))
    manifest = json.loads((tmp_path / "out" / "medusa.json").read_text())
    assert len(manifest["parts"]) == 3 and "data.safetensors" not in manifest["files"]
    assert all((tmp_path / "out" / part["name"]).stat().st_size <= 15 * 1024 for part in manifest["parts"])
    kit.join(SimpleNamespace(folder=str(tmp_path / "out"), to=str(tmp_path / "back"), name=None))
    for name in ("checkpoints/step-3/model.safetensors", "checkpoints/latest", "console.log", "big"):
        assert (tmp_path / "back" / name).read_bytes() == (folder / name).read_bytes(), name
    assert not (tmp_path / "back" / "data.safetensors").exists()

    part = tmp_path / "out" / "medusa.part-02"
    damaged = bytearray(part.read_bytes())
    damaged[100] ^= 1
    part.write_bytes(bytes(damaged))
    with pytest.raises(SystemExit, match="medusa.part-02: missing, or not the part written there"):
        kit.join(SimpleNamespace(folder=str(tmp_path / "out"), to=str(tmp_path / "again"), name="medusa"))
    assert not (tmp_path / "again").exists()
    (folder / "more").write_bytes(os.urandom(70_000))  # 8 parts: more than a call brings back
    with pytest.raises(SystemExit, match="more than 7 parts"):
        kit.split(SimpleNamespace(folder=str(folder), out=str(tmp_path / "out2"), name="x", exclude=[]))


def test_stage_train_carries_the_prompts_and_a_checked_bundle(tmp_path, monkeypatch, capsys):
    for name, path in (("KIT", "kit"), ("ASSETS", "assets"), ("HOLD", "kit/hold"), ("TRAIN", "kit/train"),
                       ("RESUME", "kit/resume")):
        monkeypatch.setattr(kit, name, tmp_path / path)
    monkeypatch.setattr(kit, "transfer_bytes", lambda carry: 12 * kit.MIB)
    (tmp_path / "assets" / "eagle").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no .*prompts.jsonl: run `kit.py pack`"):
        kit.stage(SimpleNamespace(stage="train", resume=None))
    (tmp_path / "kit" / "train").mkdir(parents=True)
    (tmp_path / "kit" / "train" / "prompts.jsonl").write_text("{}\n")
    kit.stage(SimpleNamespace(stage="train", resume=None))
    assert (tmp_path / "kit" / "hold" / "eagle").is_dir() and not (tmp_path / "assets" / "eagle").exists()
    assert 'carry [".gpu/whl", ".gpu/train"]' in capsys.readouterr().out
    kit.split(SimpleNamespace(folder=str(bundle_folder(tmp_path)), out=str(tmp_path / "back"), name="eagle",
                              exclude=[]))
    kit.stage(SimpleNamespace(stage="train", resume=str(tmp_path / "back")))
    assert 'carry [".gpu/whl", ".gpu/train", ".gpu/resume"]' in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "kit" / "resume").iterdir()) == ["eagle.json", "eagle.part-01"]
    # a training call with no room left: the part travels in a call of its own before it, into /tmp/resume
    monkeypatch.setattr(kit, "transfer_bytes", lambda carry: (kit.LIMIT_MIB * kit.MIB - 100) if carry else kit.MIB)
    kit.stage(SimpleNamespace(stage="train", resume=str(tmp_path / "back")))
    out = capsys.readouterr().out
    assert 'carry [".gpu/resume-1"]; the command: mkdir -p /tmp/resume && cp .gpu/resume-1/* /tmp/resume/' in out
    assert [p.name for p in (tmp_path / "kit" / "resume").iterdir()] == ["eagle.json"]
    assert [p.name for p in (tmp_path / "kit" / "resume-1").iterdir()] == ["eagle.part-01"]
    kit.stage(SimpleNamespace(stage="train", resume=None))  # a new run: nothing of the old bundle travels
    assert not (tmp_path / "kit" / "resume").exists() and not (tmp_path / "kit" / "resume-1").exists()


@pytest.mark.slow  # 40 s of real training runs
def test_train_script_stops_at_its_limit_hands_back_a_bundle_and_resumes_from_it(tmp_path, tiny_pair):
    """experiments/gpu/train.sh on CPU with a tiny target: the first call stops early (checkpointed) and hands back
    its checkpoint; a second call on an empty run directory (a fresh machine) joins it, builds the data again, resumes
    with the overrides of the first and hands back the finished export."""
    from helpers import CHAT_TEMPLATE

    from specdec.training.distill.prompts import write_jsonl

    model, tokenizer = tiny_pair
    tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    train = tmp_path / "kit" / "train"
    rows = [{"id": f"p/{i}", "source": "p", "category": "c", "kind": "chat", "text": f"one two three {i}"}
            for i in range(6)]
    write_jsonl(train / "prompts.jsonl", rows)
    for name in ("mtbench", "humaneval", "wikipedia"):
        write_jsonl(train / "held_out" / f"{name}.jsonl", rows[:2])
    root = Path(kit.ROOT)
    overrides = [f"target.name={tmp_path / 'target'}", "method.num_heads=2", "method.tree_nodes=3",
                 "method.draft_vocab=null", "data.num_prompts=6", "data.max_new_tokens=6", "data.batch_size=3",
                 "eval.limit_per_source=1", "eval.max_new_tokens=4", "optim.epochs=3", "optim.batch_size=4",
                 "optim.warmup_steps=1", "save_every=100"]

    def call(out: str, run: str, *extra: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "METHOD": "medusa", "DEVICE": "cpu", "BUDGET": "300", "OUT": str(tmp_path / out),
               "RUN": str(tmp_path / run), "TRAIN": str(train), "RESUME": str(tmp_path / "resume"),
               "PARTS": str(tmp_path / "parts")}
        return subprocess.run(["bash", str(root / "experiments" / "gpu" / "train.sh"), *extra], cwd=root, env=env,
                              capture_output=True, text=True, timeout=280)

    first = call("out1", "run1", *overrides, "stop_after_steps=2")
    assert first.returncode == 0, first.stdout + first.stderr
    manifest = json.loads((tmp_path / "out1" / "medusa.json").read_text())
    assert "checkpoints/latest" in manifest["files"] and not any("data" in name for name in manifest["files"])
    (tmp_path / "resume").mkdir()  # what stage train --resume carries
    for name in ("medusa.json", *(part["name"] for part in manifest["parts"])):
        (tmp_path / "resume" / name).write_bytes((tmp_path / "out1" / name).read_bytes())
    second = call("out2", "run2")  # no overrides: those of the first call
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming with the overrides it ran with" in second.stdout
    kit.join(SimpleNamespace(folder=str(tmp_path / "out2"), to=str(tmp_path / "back"), name=None))
    assert (tmp_path / "back" / "metrics.json").is_file(), second.stdout + (tmp_path / "back" / "console.log").read_text()
    metrics = json.loads((tmp_path / "back" / "metrics.json").read_text())
    assert metrics["finished"] and metrics["times_s"]["resumed_at_step"] == 2
    assert (tmp_path / "back" / "export" / "heads.safetensors").is_file()
    assert json.loads((tmp_path / "back" / "export" / "provenance.json").read_text())["metrics"]["step"] == \
        metrics["total_steps"]
