"""Adapters that replay scenarios through an installed sglang (its backends, pools, ForwardBatch, kit)."""
