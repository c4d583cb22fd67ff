"""setuptools entry point.  All metadata lives in pyproject.toml."""

from setuptools import setup

setup()
