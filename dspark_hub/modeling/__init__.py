"""The k3_dspark architecture for transformers (filled in by the modeling work)."""
