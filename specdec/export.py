"""Export a trained drafter for other engines.

    python -m specdec.export draft_model --out DIR [--model default|STUDENT_DIR] [--target smollm2-135m]
    python -m specdec.export eagle --out DIR [--model default|EAGLE_DIR] [--target smollm2-135m] [--k 3]

``draft_model``: a distilled student (the shipped default, or a directory ``python -m specdec.train
method=draft_model`` wrote) as a standalone transformers directory, the target's embeddings and LM head
stitched in and the target's tokenizer files beside them: ``AutoModelForCausalLM.from_pretrained(DIR)``
loads it, e.g. as ``generate(assistant_model=...)``'s assistant, so transformers (and other engines that
load draft models as transformers directories) run the very same draft.

``eagle``: an EAGLE-3 drafter (the shipped one, or a directory ``python -m specdec.train method=eagle`` wrote,
or one in the EAGLE repository's format) in the ``speculators`` format that vLLM and SGLang serve: vLLM's
``LLM(model=TARGET, speculative_config={"method": "eagle3", "model": DIR, "num_speculative_tokens": K})``,
or ``LLM(model=DIR)`` alone, which reads the target from ``speculators_config.verifier.name_or_path`` (written
as the target's local directory) and K from ``--k``. Weights stay as stored (float16 for the shipped one;
vLLM casts them to the target's dtype).

Each directory is written atomically (an earlier export stays until the new one is complete); an existing
directory is replaced only with ``--force``, and only if this command wrote it (its config.json names the drafter
it was exported from: ``specdec.exported_from``); never the ``--model`` directory itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdec.models.loading import DEFAULT_TARGET


def _check_out(out: str | Path, force: bool, source: Path) -> Path:
    """``out`` once it is safe to write: new, or (with ``force``) an earlier export, never ``source`` (the
    drafter read) nor a directory holding it."""
    out = Path(out).expanduser()
    mine, theirs = out.resolve(), source.expanduser().resolve()
    if mine == theirs or mine in theirs.parents:
        raise FileExistsError(f"--out {str(out)!r} is (or holds) the drafter being exported, {str(source)!r}; "
                              f"it is left as it is: choose another directory")
    if out.exists():
        if not force:
            raise FileExistsError(f"--out {str(out)!r} exists; pass --force to replace an earlier export, or "
                                  f"choose another directory")
        if not _is_export(out):
            raise FileExistsError(f"--out {str(out)!r} exists and is not a directory this command wrote (its "
                                  f"config.json has no specdec.exported_from); --force replaces only an earlier "
                                  f"export, so it is left as it is: choose another directory, or remove it yourself")
    return out


def _is_export(directory: Path) -> bool:
    """Whether ``directory`` is one this command wrote: its config.json names the drafter it was exported from
    (``export_hf`` and ``export_eagle`` write ``specdec.exported_from``)."""
    try:
        section = json.loads((directory / "config.json").read_text()).get("specdec")
    except (OSError, ValueError, AttributeError):  # no config.json, not JSON, not an object: not an export
        return False
    return isinstance(section, dict) and "exported_from" in section


def export_draft_model(out: str | Path, model: str = "default", target: str = DEFAULT_TARGET,
                       force: bool = False) -> Path:
    """Write the student ``model`` (``default``: the one shipped for the default target) of ``target`` to
    ``out`` as a transformers directory; see the module docstring."""
    from specdec.drafters.draft_model.student import DEFAULT_DRAFT, default_student_path, export_hf, load_student
    from specdec.models.loading import load_target

    path = default_student_path() if model == DEFAULT_DRAFT else Path(model).expanduser()
    out = _check_out(out, force, path)
    target_model, tokenizer = load_target(target)
    return export_hf(out, load_student(path, target_model), tokenizer, source=path)


def export_eagle(out: str | Path, model: str = "default", target: str = DEFAULT_TARGET, force: bool = False,
                 k: int = 3) -> Path:
    """Write the EAGLE-3 drafter ``model`` (``default``: the one shipped for the default target) of ``target``
    to ``out`` in the speculators format, the target's local directory as its verifier and ``k`` draft tokens
    as its default proposal; see the module docstring."""
    from specdec.drafters.eagle.model import default_eagle_path, load_eagle, save_eagle
    from specdec.jobs.io import atomic_dir
    from specdec.models.loading import load_target

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"--k must be an integer >= 1 (draft tokens per step), got {k!r}")
    path = default_eagle_path() if model == "default" else Path(model).expanduser()
    out = _check_out(out, force, path)
    target_model, _ = load_target(target)
    drafter = load_eagle(path, target_config=target_model.config)
    verifier = str(getattr(target_model, "name_or_path", "") or target)
    with atomic_dir(out) as tmp:
        save_eagle(tmp, drafter, verifier=verifier, dtype=_stored_dtype(path), extra={"exported_from": str(path)},
                   speculative_tokens=k)
    return out


def _stored_dtype(directory: Path):
    """The dtype ``directory``'s weights are stored in (fc.weight's; float32 where it cannot be read), so an
    export is as large as its source: specdec loads every drafter in float32."""
    import torch
    from safetensors import safe_open

    names = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
    try:
        with safe_open(str(directory / "model.safetensors"), "pt") as f:
            return names.get(f.get_slice("fc.weight").get_dtype(), torch.float32)
    except Exception:  # noqa: BLE001 - a question of file size only: the loaded weights are float32 anyway
        return torch.float32


EXPORTED = ("draft_model", "eagle")
# The other drafters, and why they have no export: what a user who names one is told instead of argparse's choices.
NOT_EXPORTED = {
    "dflash": "a block drafter's directory is already written as DFlash's reference drafters are (a Qwen3 config.json "
              "with dflash_config), but it has its own draft-vocabulary LM head, which SGLang's and vLLM's DFlash "
              "loaders (reading the target's full head) do not take: it has no export yet",
    "medusa": "Medusa heads are a specdec heads.safetensors (token-aware heads, a draft vocabulary) that no serving "
              "engine's Medusa loader reads: they have no export yet",
    "ngram": "prompt lookup has no weights: vLLM's speculative_config={'method': 'ngram'} does the same",
    "cross_vocab": "a draft model with another tokenizer is any causal LM already: point the engine at it",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafter", metavar="{draft_model,eagle}", help="what to export: draft_model or eagle")
    ap.add_argument("--out", required=True, help="the directory to write")
    ap.add_argument("--model", default="default",
                    help="the drafter: 'default' (the one shipped for the target) or its directory")
    ap.add_argument("--k", type=int, default=3, help="eagle: draft tokens per step written as its default proposal")
    ap.add_argument("--target", default=DEFAULT_TARGET, help="the target it drafts for (name, alias or path)")
    ap.add_argument("--force", action="store_true", help="replace an earlier export at --out")
    args = ap.parse_args(argv)
    if args.drafter not in EXPORTED:
        why = NOT_EXPORTED.get(args.drafter, "no such drafter")
        print(f"error: cannot export {args.drafter!r}: {why}; python -m specdec.export exports "
              f"{' or '.join(EXPORTED)}", file=sys.stderr)
        return 2
    if args.model != "default" and not Path(args.model).expanduser().is_dir():
        print(f"error: --model {args.model!r} is not a directory: pass the directory a training run wrote "
              f"(`python -m specdec.train method={args.drafter}`: its output_dir or its export), or leave --model "
              f"out for the drafter shipped for the default target", file=sys.stderr)
        return 2
    try:
        if args.drafter == "eagle":
            path = export_eagle(args.out, args.model, args.target, args.force, args.k)
        else:
            path = export_draft_model(args.out, args.model, args.target, args.force)
    except (OSError, ValueError) as exc:  # FileExistsError, FileNotFoundError, ModelLoadError, CheckpointError
        # the loaders' advice names the run's setting for the drafter's directory; here that is --model
        message = str(exc).replace("point drafter.path at", "pass --model")
        print(f"error: {message}", file=sys.stderr)
        return 2
    if args.drafter == "eagle":
        print(f"wrote {path} (vLLM: speculative_config={{'method': 'eagle3', 'model': {str(path)!r}, "
              f"'num_speculative_tokens': {args.k}}})")
    else:
        print(f"wrote {path} (AutoModelForCausalLM.from_pretrained({str(path)!r}))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
