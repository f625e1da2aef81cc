"""Translate: a small Transformer translating a generated English -> German grammar."""
