"""sglang 0.5.23's attention test kit, as sglfix uses it: the only modules that name the kit's
private classes and fixtures (see ``sglfix.harness.kits``). Each checks, when it first
prepares, that the active code base is this version. Imports nothing (a worker reads ``KIT_MODULES``
at boot)."""

VERSION = "0.5.23"

# The kit's modules these parts drive: a worker imports them at boot, so that its state
# snapshot covers what the kit's fixtures publish and patch.
KIT_MODULES = tuple(
    f"sglang.test.kits.attention_unittest.{m}"
    for m in (
        "attention_methods.dense_attention",
        "attention_methods.mla_attention",
        "attention_methods.dsv4_attention",
        "runner_modes.cuda_graph_decode_runner",
        "runner_modes.speculative_draft_extend_runner",
        "runner_modes.speculative_target_verify_runner",
        "runner_modes.speculative_draft_runner",
    )
)

# Called once by a worker after it imports the modules above, before its state snapshot.
BOOT = "environment:boot"
