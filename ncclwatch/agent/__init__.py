"""The per-node agent: discover ranks, sample them, classify stacks, stream reports."""
