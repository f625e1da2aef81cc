"""Seq2seq: adding numbers with an LSTM encoder-decoder on dropmask's MaskedRNN."""
