"""Probes of real sglang (the ``sglang-0.5.23`` code base): one module per probe, each defining
``PROBE``; every use of sglang's private test kit goes through ``sglfix.harness.kits``."""
