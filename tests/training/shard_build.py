"""Run under ``accelerate launch --num_processes N --cpu``: the training tests' tiny configuration's data built by N
processes (``stop_after_steps=0``: the data only) into the directory given (tests/training/test_training_store.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers

from helpers import tiny_config, tiny_train_pair  # noqa: E402

from specdec.training.trainer import train  # noqa: E402

if __name__ == "__main__":
    model, tokenizer = tiny_train_pair()
    cfg = tiny_config(Path(sys.argv[1]))
    cfg.stop_after_steps = 0
    train(cfg, model, tokenizer)
