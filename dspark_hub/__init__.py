"""dspark-hub: verify, train, card and publish k3_dspark speculative-decoding drafts."""

__version__ = "0.1.0"
