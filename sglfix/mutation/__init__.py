"""Mutation analysis of a code base's attention-metadata code (``sglfix mutate``): which lines
could break without any scenario noticing.

``model`` (what a mutant is), ``operators`` (the changes, modelled on the catalogue's fixes),
``diff`` (a mutant as a unified diff in the code base's own paths, which ``--apply`` replays),
``surface`` (which functions a campaign mutates) and ``catalogue`` (the toggles' reverts as a
check of the operators). Running the mutants is ``sglfix.execution.mutate``'s; judging them,
``sglfix.report.mutation``'s. Nothing here imports the code under test.
"""
