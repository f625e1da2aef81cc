"""Dropout on scikit-learn's handwritten digits, following the Flax Linen dropout guide."""
