"""Step-level ground truth: cells (one forward step each) built from the store's op tables."""
