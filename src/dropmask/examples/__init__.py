"""Examples that ship with the package: ``dropmask train digits`` runs anywhere.

The heavier examples (sst2, seq2seq, translate) live in a source checkout's
``examples/``; ``dropmask train --list`` says where each one is.
"""
