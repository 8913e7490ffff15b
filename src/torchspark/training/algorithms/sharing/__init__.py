"""Gradient sharing (Strom 2015, DL4J's ``SharedTrainingMaster``): every worker threshold-encodes its updater's
step, keeps the rest as a residual, and applies the sum of every worker's sparse message.

Two algorithms (modes of [`ALGORITHMS`][torchspark.training.ALGORITHMS]) built from the same parts:

* `loop`: ``"sharing"``, the synchronous overlapped loop (`SharingAlgorithm`);
* `stale`: ``"stale_sharing"``, bounded staleness (`StaleSharingAlgorithm`), with its
  bookkeeping in `ledger`.

Their parts: `settings` (the knobs), `state` (a worker's residual, threshold state and counters),
`step` (compute + encode one update) over `fused` (the update stepped straight into the residual),
`collectives` (the agreed start threshold, the epoch's score), `rounds` (the wire format of a round),
`topology` and `sharded` (how a round travels), `finish` (the end of a fit). The design is in
docs/design.md, "The gradient-sharing round".
"""
