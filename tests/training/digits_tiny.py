"""The digits example's tiny config, which drives the shared-loop tests.

Each guarantee of the loop is tested for both front ends: ``digits`` (Linen) and
``digits_nnx`` (the same MLP in Flax NNX, on the same data and config).
"""

import pathlib
import sys

import ml_collections

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def tiny_config() -> ml_collections.ConfigDict:
    """Digits' tiny config, logging every step so that every step's loss is recorded."""
    from dropmask.examples.digits import configs

    config = configs.get_tiny_config()
    config.log_every = 1
    return config


def digits_example():
    """The digits :class:`dropmask.training.Example`."""
    from dropmask.examples.digits.train import example

    return example


# The examples every loop guarantee is tested on: one per Flax API.
EXAMPLES = ("digits", "digits_nnx")


def example_named(name: str):
    """The bundled :class:`dropmask.training.Example` called ``name``."""
    import importlib

    return importlib.import_module(f"dropmask.examples.{name}.train").example
