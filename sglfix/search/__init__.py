"""What ``sglfix search`` draws and shrinks, apart from running it: the search space, scenarios
drawn from the scenario schema for a code base (``space``, over ``schema_types``), and the
reductions that shrink a failing one (``shrink``). The cells run in ``sglfix.execution``."""
