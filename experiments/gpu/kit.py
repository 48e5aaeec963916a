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

Training on the GPU (experiments/gpu/train.sh) reads its prompts from ``.gpu/train`` (``pack`` writes them) and hands
back its results as a bundle: ``split`` cuts a folder into parts just under 16 MiB with a manifest of every file's
and part's SHA-256 (a call brings back 8 files of at most 16 MiB), ``join`` checks them bit for bit and rebuilds the
folder, here or there (``stage train --resume`` carries a bundle back to resume from its checkpoint: the parts that
do not fit the training's call travel in calls of their own before it, ``.gpu/resume-N``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / ".gpu"
ASSETS = ROOT / "specdec" / "assets"
HOLD = KIT / "hold"  # the shipped drafters while the target's parts travel
TRAIN = KIT / "train"  # the self-distillation prompts and the held-out sets (train.sh)
RESUME = KIT / "resume"  # a bundle train.sh brought back, carried to resume its checkpoint
PART_BYTES = 16 * (1 << 20) - (1 << 16)  # a bundle's parts: 64 KiB under the 16 MiB a file brought back may hold
MAX_PARTS = 7  # with the manifest, the 8 files a call brings back
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
    train_prompts(out / "train", args.train_prompts)
    if not args.no_wheels:
        wheels(out / "whl")


def train_prompts(folder: Path, num: int) -> None:
    """The training's prompts as files (the device has neither the corpora nor their packages): ``num`` of
    :func:`specdec.training.distill.prompts.instruction_prompts` (seed 0, the first 16 rows of each corpus left out, as
    ``python -m specdec.train`` makes them; ``data.num_prompts`` reads the first ones) in ``prompts.jsonl``, and the
    held-out sets the trainer evaluates on (MT-Bench, HumanEval, Wikipedia's first 16 rows) under ``held_out/``."""
    from specdec.training.distill.prompts import write_prompt_files

    shutil.rmtree(folder, ignore_errors=True)
    paths = write_prompt_files(folder / "prompts.jsonl", num, held_out=folder / "held_out")
    size = sum(p.stat().st_size for p in paths) / MIB
    print(f"training prompts: {num} in {folder / 'prompts.jsonl'} and the held-out sets, {size:.1f} MiB")


def split(args) -> None:
    """``--out``/NAME.json and NAME.part-NN: the folder's files (less ``--exclude``'d names) as one tar, gzip'd at
    level 1 (a float32 checkpoint shrinks ~7%: EAGLE's 118 MB then fits 7 parts), cut into parts of at most PART_BYTES,
    with every file's and part's SHA-256 and the whole's; refused past MAX_PARTS."""
    folder, out = Path(args.folder), Path(args.out)
    left_out = set(args.exclude)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not set(p.relative_to(folder).parts) & left_out)
    out.mkdir(parents=True, exist_ok=True)
    tar_path = out / f".{args.name}.tar.gz"
    with tarfile.open(tar_path, "w:gz", compresslevel=1, format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    total = tar_path.stat().st_size
    count = -(-total // PART_BYTES)
    if count > MAX_PARTS:
        tar_path.unlink()
        raise SystemExit(f"{folder}: {total / MIB:.1f} MiB is more than {MAX_PARTS} parts of {PART_BYTES / MIB:.2f} MiB "
                         f"(what a call brings back); leave more out (--exclude)")
    manifest = {"name": args.name, "bytes": total, "sha256": file_sha256(tar_path),
                "files": {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
                          for p in files}, "parts": []}
    with open(tar_path, "rb") as whole:
        for i in range(1, count + 1):
            part = out / f"{args.name}.part-{i:02d}"
            part.write_bytes(whole.read(PART_BYTES))
            manifest["parts"].append({"name": part.name, "bytes": part.stat().st_size, "sha256": file_sha256(part)})
    tar_path.unlink()
    (out / f"{args.name}.json").write_text(json.dumps(manifest, indent=1))
    print(f"{folder}: {len(files)} files, {total / MIB:.1f} MiB in {count} part(s) under {out} ({args.name}.json)")


def check_bundle(folder: Path, name: str | None = None) -> tuple[Path, dict]:
    """The manifest under ``folder`` (``name``.json, or its one ``*.json`` with parts) and the manifest, every part's
    size and SHA-256 checked; SystemExit naming the first that differs."""
    found = [p for p in folder.glob(f"{name or '*'}.json") if "parts" in json.loads(p.read_text())]
    if len(found) != 1:
        raise SystemExit(f"{folder}: expected one bundle manifest (NAME.json beside NAME.part-NN), found "
                         f"{[p.name for p in found]}")
    manifest = json.loads(found[0].read_text())
    for part in manifest["parts"]:
        path = folder / part["name"]
        if not path.is_file() or path.stat().st_size != part["bytes"] or file_sha256(path) != part["sha256"]:
            raise SystemExit(f"{path}: missing, or not the part written there ({part['bytes']} bytes, SHA-256 "
                             f"{part['sha256'][:12]}...): fetch that call's files again")
    return found[0], manifest


def join(args) -> None:
    """Rebuild a folder :func:`split` cut: every part, the whole and every file checked bit for bit against the
    manifest; the files land in ``--to`` (files already there of the same names are replaced, others kept)."""
    folder, to = Path(args.folder), Path(args.to)
    path, manifest = check_bundle(folder, args.name)
    tmp = to.with_name(f".{to.name}.join")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    whole = tmp / ".bundle.tar.gz"
    with open(whole, "wb") as out:
        for part in manifest["parts"]:
            out.write((folder / part["name"]).read_bytes())
    if file_sha256(whole) != manifest["sha256"]:
        raise SystemExit(f"{folder}: the parts join into another tar than the one split (SHA-256); fetch them again")
    with tarfile.open(whole) as tar:
        tar.extractall(tmp, filter="data")
    whole.unlink()
    for name, entry in manifest["files"].items():
        if file_sha256(tmp / name) != entry["sha256"]:
            raise SystemExit(f"{name} did not come back bit for bit; fetch the parts again")
    for name in manifest["files"]:
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tmp / name), str(to / name))
    shutil.rmtree(tmp)
    print(f"{to}: {len(manifest['files'])} files of {path.name} rebuilt bit for bit "
          f"({manifest['bytes'] / MIB:.1f} MiB)")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    # training (train.sh): the drafters stay out of the tree, room for the prompts and a checkpoint to resume
    "train": ([".gpu/whl", ".gpu/train"],
              "source experiments/gpu/setup.sh && METHOD=<method> BUDGET=540 bash experiments/gpu/train.sh"),
}
# shipped drafters that travel beside the target's second part (stage 2: 38 MiB), since stage 3's tree holding every
# drafter would pass the limit; setup.sh copies them from /tmp/kit/assets into the tree there
LATE = ("dflash",)


def stage(args) -> None:
    """Move the shipped drafters out of the tree (stages 1, 2: the target's parts travel; ``train``) or back (stage
    3, but those of ``LATE``, which stage 2 carried; ``restore``: all), and print the call to make. ``train`` with
    ``--resume``: the bundle a training call brought back (checked) is carried too, in ``.gpu/resume``."""
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
    if args.stage == "train":
        if not (TRAIN / "prompts.jsonl").is_file():
            raise SystemExit(f"no {TRAIN / 'prompts.jsonl'}: run `kit.py pack` (or `kit.py train-prompts`) first")
        if args.resume:
            carry = carry + [".gpu/resume"]
            resume_calls(Path(args.resume), transfer_bytes(carry))
        else:
            for old in [RESUME, *KIT.glob("resume-*")]:
                shutil.rmtree(old, ignore_errors=True)
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


def resume_calls(bundle: Path, carried: int) -> None:
    """A bundle train.sh brought back (checked), spread for the calls that carry it: the manifest and the parts that fit
    beside the training call's ``carried`` bytes in ``.gpu/resume``, the others in ``.gpu/resume-1``, ``-2``, ...,
    each a call of its own before the training's (its command copies them to /tmp/resume, where train.sh finds them).
    Prints those calls."""
    _, manifest = check_bundle(bundle)
    for old in [RESUME, *KIT.glob("resume-*")]:
        shutil.rmtree(old, ignore_errors=True)
    tree = transfer_bytes([])
    folders, room = [RESUME], LIMIT_MIB * MIB - carried
    RESUME.mkdir(parents=True)
    shutil.copyfile(bundle / f"{manifest['name']}.json", RESUME / f"{manifest['name']}.json")
    for part in manifest["parts"]:
        if part["bytes"] > room:
            folders.append(KIT / f"resume-{len(folders)}")
            folders[-1].mkdir()
            room = LIMIT_MIB * MIB - tree
        shutil.copyfile(bundle / part["name"], folders[-1] / part["name"])
        room -= part["bytes"]
    print(f"resuming {manifest['name']}: {len(manifest['parts'])} part(s), {manifest['bytes'] / MIB:.1f} MiB")
    for folder in folders[1:]:
        size = (tree + sum(p.stat().st_size for p in folder.iterdir())) / MIB
        print(f"before the training's call, one of its own ({size:.1f} MiB): carry [\".gpu/{folder.name}\"]; the "
              f"command: mkdir -p /tmp/resume && cp .gpu/{folder.name}/* /tmp/resume/")


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
    p.add_argument("--train-prompts", type=int, default=32768,
                   help="self-distillation prompts written to .gpu/train (data.num_prompts reads the first ones)")
    p.set_defaults(run=pack)
    p = sub.add_parser("train-prompts", help="only the training's prompts and held-out sets, under .gpu/train")
    p.add_argument("--num", type=int, default=32768)
    p.set_defaults(run=lambda args: train_prompts(TRAIN, args.num))
    p = sub.add_parser("split", help="a folder as parts under 16 MiB and a manifest (train.sh, on the device)")
    p.add_argument("folder")
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True, help="the manifest's and parts' name")
    p.add_argument("--exclude", nargs="*", default=[], help="file or folder names left out")
    p.set_defaults(run=split)
    p = sub.add_parser("join", help="the folder a bundle's parts hold, checked bit for bit")
    p.add_argument("folder", help="where NAME.json and NAME.part-NN are (a call's files)")
    p.add_argument("--to", required=True)
    p.add_argument("--name", default=None, help="the bundle's name, where the folder holds several")
    p.set_defaults(run=join)
    p = sub.add_parser("unpack", help="rebuild the target from the parts (on the device machine)")
    p.add_argument("--kit", required=True, help="the folder holding target-1, target-2, ...")
    p.add_argument("--to", required=True, help="the target's directory to write (under $SPECDEC_CACHE)")
    p.set_defaults(run=unpack)
    p = sub.add_parser("stage", help="the tree for one call (1, 2, 3) or as it was (restore)")
    p.add_argument("stage", choices=["1", "2", "3", "train", "restore"])
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="train: the files a training call brought back (NAME.json, NAME.part-NN), to resume from")
    p.set_defaults(run=stage)
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
