"""A user's own Flax NNX example outside dropmask, which CI trains from the installed wheel."""
