"""Training: data making (masking, pairs, corpora, tasks), the shared loop, metrics."""
