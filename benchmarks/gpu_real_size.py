"""The zoo's real-size models on one GPU: steady samples/s of ``Network.fit`` in fp32 and bf16, and that they learn.

Run (on a GPU machine; torch and torchspark only, no Spark): ``PYTHONPATH=src python3 benchmarks/gpu_real_size.py
[--n 4096] [--device cuda] [--out gpu_real_size.json]``. VGG (13.5 M parameters) on 32x32x3 synthetic images and
the text transformer (6.2 M, 5.1 M of them the token embedding) on synthetic keyword sequences; Adam, batch 128;
samples/s over two epochs after a warm-up epoch; accuracy on the training set after the three epochs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from torchspark import Network, datasets, models, optim


def _case(name: str, n: int) -> tuple[Any, Any]:
    if name == "vgg":
        return datasets.synthetic_images(n, 3, 32, 32, n_classes=10, seed=0), models.vgg(3, 10)
    return datasets.synthetic_keywords(n, seed=0), models.text_transformer(20000, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="gpu_real_size.json")
    args = parser.parse_args()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
    for name in ("vgg", "text_transformer"):
        for precision in ("fp32", "bf16"):
            data, module = _case(name, args.n)
            net = Network(module, updater=optim.Adam(lr=1e-3), seed=0, device=args.device, precision=precision)
            net.fit(data, epochs=1, batch_size=128)
            sync()
            t = time.perf_counter()
            net.fit(data, epochs=2, batch_size=128)
            sync()
            dt = time.perf_counter() - t
            row = {
                "params": sum(p.numel() for p in net.module.parameters()),
                "samples_per_s": round(2 * len(data) / dt),
                "train_accuracy": round(net.evaluate(data).accuracy(), 4),
            }
            out[f"{name}/{precision}"] = row
            print(name, precision, row, flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
