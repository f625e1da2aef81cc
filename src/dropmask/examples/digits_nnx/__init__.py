"""The digits example in Flax NNX: the same data, config and loop, an ``nnx.Module`` model."""
