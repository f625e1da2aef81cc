"""A decoder-only Transformer language model in Flax NNX on Python's own documentation."""
