"""ParallelWrapper: the Spark training algorithms on one machine, with local worker processes (no Spark).

Trains LeNet on the built-in 8x8 digits with gradient sharing (or parameter averaging) over ``--num-workers``
processes, then evaluates. Use it on a many-core or multi-GPU box, or to try a cluster configuration on a laptop. ::

    python examples/parallel_wrapper.py --num-workers 4 --training-mode sharing --epochs 10
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from typing import Any

from torchspark import Network, datasets, models, optim
from torchspark.parallel import ParallelWrapper

log = logging.getLogger("examples.parallel_wrapper")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-workers", type=int, default=2, help="worker processes")
    p.add_argument("--training-mode", choices=["averaging", "sharing"], default="sharing")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--examples", type=int, default=None, help="use only the first N training examples")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    train, test = datasets.digits("train"), datasets.digits("test")
    if args.examples is not None:
        train = train.split(args.examples)[0]
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=args.lr), seed=args.seed)
    wrapper = ParallelWrapper(
        net, num_workers=args.num_workers, training_mode=args.training_mode, rng_seed=args.seed, progress=False
    )
    wrapper.fit(train, epochs=args.epochs, batch_size=args.batch_size)
    evaluation = net.evaluate(test)
    log.info("%s", evaluation.stats())
    return {
        "workers": args.num_workers,
        "mode": args.training_mode,
        "examples": len(train),
        "accuracy": evaluation.accuracy(),
    }


if __name__ == "__main__":  # the guard matters: worker processes import this file
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(json.dumps(main()))
