"""``python -m specdec.train_medusa ...`` is ``python -m specdec.train ...`` (Medusa is its default method)."""

from specdec.train import main

if __name__ == "__main__":
    main()
