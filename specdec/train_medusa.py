"""``python -m specdec.train_medusa ...`` is ``python -m specdec.train ...`` (Medusa is its default method)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("specdec.train", run_name="__main__", alter_sys=True)
