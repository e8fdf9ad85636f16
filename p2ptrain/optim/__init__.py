"""The swarm optimizers behind one protocol: gradient averaging and DiLoCo, and the training step.

- ``protocol``      what the node asks of its optimizer (``SwarmOptimizer``), free of hivemind's names
- ``build``         the optimizer ``training.mode`` asks for
- ``gradient``      hivemind's collaborative optimizer, bounded and accounted
- ``diloco``        DiLoCo's rounds: inner AdamW steps, an all-reduce, an outer step
- ``diloco_state``  DiLoCo's state downloads, served state and checkpoints
- ``inner``         the clipped AdamW and the LR schedule both modes use
- ``outer_step``    DiLoCo's outer SGD step, free of networking
- ``error_feedback`` what a compressed outer round sends of a peer's pseudo-gradient, and what it keeps
- ``microbatches``  gradient accumulation over an inner step's micro-batches
- ``round_clock``   what a peer does with DiLoCo's round clock: inner-step size, schedule position, group round
- ``retune``        applying a new manifest version's learning settings to a running optimizer
- ``rollback``      undoing an average that made the parameters non-finite
- ``solo_round``    whether a round with nobody else failed, or the node trains alone
- ``defences``      the node's peer checks in one bundle
- ``round_stats``   honest figures for rounds; ``swarm_stats`` the thread-safe counters
- ``trainer``       one local training step and what it measured

May import: torch, :mod:`p2ptrain.averaging`, :mod:`p2ptrain.trust`, :mod:`p2ptrain.tasks`,
:mod:`p2ptrain.config`.
"""
