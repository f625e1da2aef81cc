"""SST-2-style sentiment with a bidirectional masked LSTM, word dropout and masked pooling."""
