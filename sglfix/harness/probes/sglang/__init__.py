"""Probes of real sglang (the code bases of the ``sglang-*`` profiles): one module per probe, each defining
``PROBE``; every use of sglang's private test kit goes through ``sglfix.harness.kits``."""
