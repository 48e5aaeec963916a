"""Export a trained drafter for other engines.

    python -m specdec.export draft_model --out DIR [--model default|STUDENT_DIR] [--target smollm2-135m]

``draft_model``: a distilled student (the shipped default, or a directory ``python -m specdec.train
method=draft_model`` wrote) as a standalone transformers directory, the target's embeddings and LM head
stitched in and the target's tokenizer files beside them: ``AutoModelForCausalLM.from_pretrained(DIR)``
loads it, e.g. as ``generate(assistant_model=...)``'s assistant, so transformers (and other engines that
load draft models as transformers directories) run the very same draft. The directory is written
atomically; an existing directory is replaced only with ``--force``, and only if it holds an earlier export.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.loading import DEFAULT_TARGET


def export_draft_model(out: str | Path, model: str = "default", target: str = DEFAULT_TARGET,
                       force: bool = False) -> Path:
    """Write the student ``model`` (``default``: the one shipped for the default target) of ``target`` to
    ``out`` as a transformers directory; see the module docstring."""
    from specdec.drafters.student import DEFAULT_DRAFT, default_student_path, export_hf, load_student
    from specdec.loading import load_target

    out = Path(out).expanduser()
    if out.exists():
        if not force:
            raise FileExistsError(f"--out {str(out)!r} exists; pass --force to replace an earlier export, or "
                                  f"choose another directory")
        if not (out / "config.json").is_file():
            raise FileExistsError(f"--out {str(out)!r} exists and holds no exported model (no config.json); "
                                  f"it is left as it is: choose another directory")
    target_model, tokenizer = load_target(target)
    student = load_student(default_student_path() if model == DEFAULT_DRAFT else model, target_model)
    return export_hf(out, student, tokenizer)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafter", choices=["draft_model"], help="what to export")
    ap.add_argument("--out", required=True, help="the directory to write")
    ap.add_argument("--model", default="default", help="the student: 'default' (shipped) or its directory")
    ap.add_argument("--target", default=DEFAULT_TARGET, help="the target it drafts for (name, alias or path)")
    ap.add_argument("--force", action="store_true", help="replace an earlier export at --out")
    args = ap.parse_args(argv)
    try:
        path = export_draft_model(args.out, args.model, args.target, args.force)
    except (OSError, ValueError) as exc:  # FileExistsError, FileNotFoundError, ModelLoadError, CheckpointError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} (AutoModelForCausalLM.from_pretrained({str(path)!r}))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
