"""What GPU work needs, packed here for a GPU machine without network, and rebuilt there (not a test).

The GPU machines this project borrows have torch and transformers but none of specdec's other packages, no
corpora and no network, and each transfer to one carries at most 64 MiB with the working tree (whose shipped
drafters alone are 84 MB). The embedded target (its Q4_1 GGUF dequantised to float32: 538 MB) therefore
travels as the exact block codes it is made of: per block of 32 weights along k, 4-bit codes with a float16
scale and an offset, or the embedding's 8-bit codes with a float16 scale (``specdec.models.cpu_kernels``' fit,
the one the CPU kernels stream), ~96 MB in two parts. ``unpack`` rebuilds every tensor bit for bit (each one's
SHA-256 is checked) with torch alone. The transfers, stage by stage, are in experiments/gpu/README.md:

    python experiments/gpu/kit.py pack                # here, once: .gpu/ (ignored by git)
    python experiments/gpu/kit.py stage 1             # here, before each transfer: moves the shipped drafters
                                                      # out of the tree or back, prints what to carry
    python3 experiments/gpu/kit.py unpack --kit /tmp/kit --to /tmp/cache/smollm2-135m-instruct   # there
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / ".gpu"
ASSETS = ROOT / "specdec" / "assets"
HOLD = KIT / "hold"  # the shipped drafters while the target's parts travel
BLOCK = 32
MIB = 1 << 20
LIMIT_MIB = 64  # what one transfer to the GPU machine carries, the working tree included
# Packages specdec imports that the device image lacks (omegaconf for the configs, datasets for specdec.jobs.data,
# hydra-core for the jobs); their versions are read from this environment.
WHEELS = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "dill", "multiprocess")
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def sha256(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def encode(name: str, weight: torch.Tensor) -> tuple[str, dict[str, torch.Tensor]]:
    """(form, stored tensors) for one tensor: ``codes4`` (nibbles [N, K/2], low nibble the even k; scale
    float16 and offset [N, K/32]), ``codes8`` (int8 [N, K]; scale [N, K/32]) or ``raw``. Every coded form is
    checked to give the tensor back bit for bit (:func:`decode`); a tensor none fits travels raw."""
    from specdec.models.cpu_kernels import _fit_codes

    if weight.dim() == 2 and weight.dtype == torch.float32 and weight.shape[1] % BLOCK == 0:
        n, k = weight.shape
        for bits in (4, 8):
            fit = _fit_codes(weight.reshape(-1, BLOCK), bits)
            if fit is None:
                continue
            scale, offset = (t.reshape(n, k // BLOCK) for t in fit[:2])  # [R, 1] each, a row per block
            stored = {"scale": scale.to(torch.float16)}
            if bits == 4:
                codes = fit[2].reshape(n, k).to(torch.uint8)
                stored["codes"] = codes[:, 0::2] | (codes[:, 1::2] << 4)
                half = offset.to(torch.float16)
                stored["offset"] = half if torch.equal(half.float(), offset) else offset
            else:
                stored["codes"] = fit[2].reshape(n, k).to(torch.int8)
            form = f"codes{bits}"
            if torch.equal(decode(form, stored, weight.shape).view(torch.int32), weight.view(torch.int32)):  # bits
                return form, stored
    return "raw", {"value": weight.contiguous()}


def decode(form: str, stored: dict[str, torch.Tensor], shape) -> torch.Tensor:
    """The tensor :func:`encode` stored, as ``scale · code + offset`` in float32 (the fit's own arithmetic)."""
    if form == "raw":
        return stored["value"]
    n, k = shape
    scale = stored["scale"].float()[..., None]  # [N, K/32, 1]
    if form == "codes4":
        nibbles = stored["codes"]
        codes = torch.stack([nibbles & 15, nibbles >> 4], -1).reshape(n, k // BLOCK, BLOCK).float()
        return (scale * codes + stored["offset"].float()[..., None]).reshape(n, k)
    return (scale * stored["codes"].float().view(n, k // BLOCK, BLOCK)).reshape(n, k)


def pack(args) -> None:
    from safetensors.torch import load_file, save_file

    from specdec.models.loading import ensure_smollm2_cache

    source = ensure_smollm2_cache()
    tensors = load_file(str(source / "model.safetensors"))
    parts: list[dict] = [{}]
    manifest, size = {}, 0
    for name in sorted(tensors, key=lambda n: -tensors[n].numel()):  # the largest first: parts fill evenly
        form, stored = encode(name, tensors[name])
        nbytes = sum(t.numel() * t.element_size() for t in stored.values())
        if size and size + nbytes > args.part_mib * MIB:
            parts.append({})
            size = 0
        size += nbytes
        parts[-1].update({f"{name}::{key}": t.contiguous() for key, t in stored.items()})
        manifest[name] = {"form": form, "shape": list(tensors[name].shape), "dtype": str(tensors[name].dtype),
                          "sha256": sha256(tensors[name]), "part": len(parts)}
    out = Path(args.out)
    for old in out.glob("target-*"):
        shutil.rmtree(old)
    for i, stored in enumerate(parts, 1):
        folder = out / f"target-{i}"
        folder.mkdir(parents=True)
        save_file(stored, str(folder / "part.safetensors"))
    files = out / "target-1" / "files"  # config, generation config, tokenizer: beside the rebuilt weights
    files.mkdir()
    for path in source.iterdir():
        if path.name != "model.safetensors":
            shutil.copy2(path, files / path.name)
    (out / "target-1" / "manifest.json").write_text(json.dumps({"parts": len(parts), "tensors": manifest}, indent=1))
    forms = {f: sum(1 for m in manifest.values() if m["form"] == f) for f in ("codes4", "codes8", "raw")}
    sizes = [sum(p.stat().st_size for p in (out / f"target-{i}").rglob("*") if p.is_file()) / MIB
             for i in range(1, len(parts) + 1)]
    print(f"target {source}: {len(manifest)} tensors ({forms}) in {len(parts)} parts of "
          f"{', '.join(f'{s:.1f}' for s in sizes)} MiB under {out}")
    # the benchmark's prompts as token ids (the device has neither the corpora nor the datasets package)
    subprocess.run([sys.executable, str(ROOT / "experiments" / "benchmarks" / "gpu.py"), "--dump-prompts",
                    str(out / "prompts.json"), "--source", "mix", "--prompts", "24"], check=True)
    if not args.no_wheels:
        wheels(out / "whl")


def wheels(folder: Path) -> None:
    """The device image's missing packages as wheels for Python 3.12 (antlr4-python3-runtime has no wheel on
    PyPI: built here, pure Python)."""
    from importlib.metadata import version

    folder.mkdir(parents=True, exist_ok=True)
    for name in WHEELS:
        spec = f"{name}=={version(name)}"
        if name == "antlr4-python3-runtime":
            command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), spec]
        else:
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                       "--python-version", DEVICE_PYTHON, "--implementation", "cp", "-d", str(folder), spec]
            command += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        subprocess.run(command, check=True)
    print(f"wheels: {', '.join(sorted(p.name for p in folder.glob('*.whl')))}")


def unpack(args) -> None:
    """Rebuild the target's directory from the parts under --kit (each ``target-i`` folder); every tensor's
    SHA-256 is checked against the one taken here. Nothing is written unless all of them match."""
    from safetensors.torch import load_file, save_file

    kit, out = Path(args.kit), Path(args.to)
    if (out / "model.safetensors").is_file() and (out / ".kit-rebuilt").is_file():
        print(f"{out}: already rebuilt")
        return
    if not (kit / "target-1" / "manifest.json").is_file():
        raise SystemExit(f"no {kit / 'target-1' / 'manifest.json'}: run stage 1 (carry .gpu/target-1, copy it to "
                         f"{kit})")
    manifest = json.loads((kit / "target-1" / "manifest.json").read_text())
    missing = [i for i in range(1, manifest["parts"] + 1) if not (kit / f"target-{i}" / "part.safetensors").is_file()]
    if missing:
        raise SystemExit(f"parts {missing} are not under {kit}: carry .gpu/target-N and copy it there (stage N)")
    stored: dict[str, torch.Tensor] = {}
    for i in range(1, manifest["parts"] + 1):
        stored.update(load_file(str(kit / f"target-{i}" / "part.safetensors")))
    tensors = {}
    for name, entry in manifest["tensors"].items():
        parts = {key.split("::", 1)[1]: t for key, t in stored.items() if key.split("::", 1)[0] == name}
        tensors[name] = decode(entry["form"], parts, entry["shape"])
        if sha256(tensors[name]) != entry["sha256"]:
            raise SystemExit(f"{name} did not rebuild bit for bit ({entry['form']}); pack again here")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(kit / "target-1" / "files", tmp)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / ".kit-rebuilt").write_text("rebuilt from the GPU kit's block codes, every tensor's SHA-256 checked\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"{out}: {len(tensors)} tensors rebuilt bit for bit")


STAGES = {  # stage -> (carried paths, the command there); the shipped drafters travel in stage 3, but LATE's in 2
    "1": ([".gpu/target-1"], "mkdir -p /tmp/kit && cp -r .gpu/target-1 /tmp/kit/ && du -sh /tmp/kit"),
    "2": ([".gpu/target-2"], "mkdir -p /tmp/kit/assets && cp -r .gpu/target-2 /tmp/kit/{late} && du -sh /tmp/kit"),
    "3": ([".gpu/whl", ".gpu/prompts.json"], "source experiments/gpu/setup.sh && <the work>"),
}
# shipped drafters that travel beside the target's second part (stage 2: 38 MiB), since stage 3's tree holding every
# drafter would pass the limit; setup.sh copies them from /tmp/kit/assets into the tree there
LATE = ("dflash",)


def stage(args) -> None:
    """Move the shipped drafters out of the tree (stages 1, 2: the target's parts travel) or back (stage 3, but
    those of ``LATE``, which stage 2 carried; ``restore``: all), and print the call to make."""
    keep = args.stage in ("3", "restore")
    HOLD.mkdir(parents=True, exist_ok=True)
    source, target = (HOLD, ASSETS) if keep else (ASSETS, HOLD)
    for path in sorted(source.iterdir()):
        if args.stage == "3" and path.name in LATE:
            continue
        if (target / path.name).exists():
            raise SystemExit(f"{target / path.name} exists already: sort {path} out by hand (git status)")
        shutil.move(str(path), str(target / path.name))
    if args.stage == "restore":
        print(f"the shipped drafters are back in {ASSETS}")
        return
    carry, command = STAGES[args.stage]
    if args.stage == "2":
        late = [f".gpu/hold/{name}" for name in LATE if (HOLD / name).is_dir()]
        carry = carry + late
        command = command.format(late="".join(f" && cp -r {path} /tmp/kit/assets/" for path in late))
    size = transfer_bytes(carry) / MIB
    print(f"specdec/assets: {'in the tree' if keep else 'held in ' + str(HOLD)}; this transfer: {size:.1f} MiB "
          f"(the tree and what is carried; at most {LIMIT_MIB})")
    print(f"carry {json.dumps(carry)}; the command: {command}")
    if size > LIMIT_MIB:
        raise SystemExit(f"{size:.1f} MiB is more than a transfer carries: pack again with a smaller --part-mib")


def transfer_bytes(carry: list[str]) -> int:
    """What travels: the files git tracks or does not ignore, as they are in the tree, and the carried paths."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    files = [ROOT / name for name in listed if name and (ROOT / name).is_file()]
    for path in map(ROOT.joinpath, carry):
        files += [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path] if path.is_file() else []
    return sum(p.stat().st_size for p in files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="the target's parts and the wheels, under --out")
    p.add_argument("--out", default=str(KIT))
    p.add_argument("--part-mib", type=float, default=56.0,
                   help="the most a part may hold (part 1 also holds the 3.5 MB of tokenizer files)")
    p.add_argument("--no-wheels", action="store_true")
    p.set_defaults(run=pack)
    p = sub.add_parser("unpack", help="rebuild the target from the parts (on the device machine)")
    p.add_argument("--kit", required=True, help="the folder holding target-1, target-2, ...")
    p.add_argument("--to", required=True, help="the target's directory to write (under $SPECDEC_CACHE)")
    p.set_defaults(run=unpack)
    p = sub.add_parser("stage", help="the tree for one call (1, 2, 3) or as it was (restore)")
    p.add_argument("stage", choices=["1", "2", "3", "restore"])
    p.set_defaults(run=stage)
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
