"""Packaging beside pyproject.toml for one thing pyproject cannot say: the top-level configs/ directory
ships inside the package as ``specdec/configs`` (package data), so an installed, non-editable specdec finds
its Hydra configs (see :func:`specdec.config.config_dir`). specdec/csrc (the CPU kernel's C++ source, built on
first use) ships as package data too."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["specdec", "specdec.*"]), "specdec.configs"],
    package_dir={"specdec.configs": "configs"},
    package_data={"specdec": ["assets/**/*", "csrc/*.cpp", "csrc/*.h"], "specdec.configs": ["*.yaml", "**/*.yaml"]},
)
