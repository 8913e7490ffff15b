"""Gradient sharing (Strom 2015, DL4J's ``SharedTrainingMaster``): every worker threshold-encodes its updater's
step, keeps the rest as a residual, and applies the sum of every worker's sparse message.

Two algorithms (modes of :data:`~torchspark.training.algorithms.ALGORITHMS`) built from the same parts:

* :mod:`.loop`: ``"sharing"``, the synchronous overlapped loop (:class:`~.loop.SharingAlgorithm`);
* :mod:`.stale`: ``"stale_sharing"``, bounded staleness (:class:`~.stale.StaleSharingAlgorithm`), with its
  bookkeeping in :mod:`.ledger`.

Their parts: :mod:`.settings` (the knobs), :mod:`.state` (a worker's residual, threshold state and counters),
:mod:`.step` (compute + encode one update) over :mod:`.fused` (the update stepped straight into the residual),
:mod:`.collectives` (the agreed start threshold, the epoch's score), :mod:`.rounds` (the wire format of a round),
:mod:`.topology` and :mod:`.sharded` (how a round travels), :mod:`.finish` (the end of a fit). The design is in
docs/design.md, "The gradient-sharing round".
"""
