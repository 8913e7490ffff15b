"""A learning-rate schedule and L1 travel to ParallelWrapper's worker processes and drive every step there."""

from __future__ import annotations

import pytest
import torch

from reference_loops import averaging_reference
from torchspark import Network, datasets, models, optim
from torchspark.parallel import ParallelWrapper
from torchspark.schedules import MapSchedule
from torchspark.training.assignment import split_examples

BATCH = 8


def test_schedule_and_l1_reach_the_worker_processes() -> None:
    data = datasets.synthetic_classification(64, 12, 3, seed=5)  # 4 minibatches per worker and epoch
    schedule = MapSchedule({0: 0.3, 2: 0.05, 5: 0.01})  # changes inside the first and the second epoch

    def network(lr) -> Network:
        return Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=lr, fused=False), seed=0, l1=1e-3)

    net = network(schedule)
    shards = split_examples([data], BATCH, 2, None)
    expected = averaging_reference(net, shards, epochs=2, frequency=1, save_updater=True)
    fixed = averaging_reference(network(0.3), shards, epochs=2, frequency=1, save_updater=True)
    ParallelWrapper(
        net, num_workers=2, training_mode="averaging", averaging_frequency=1, threads_per_worker=1, progress=False
    ).fit(data, epochs=2, batch_size=BATCH)
    torch.testing.assert_close(net.params(), expected.params())
    assert not torch.allclose(net.params(), fixed.params(), atol=1e-4), "the schedule must matter"
    assert net.iteration == 8 and net.current_lr() == pytest.approx(0.01)


def test_a_torch_scheduler_factory_steps_with_every_worker_process() -> None:
    """Two worker processes averaging after every step with a per-step CosineAnnealingLR end where a plain
    PyTorch loop ends that averages the two workers' gradients and steps the same scheduler once per step."""
    import functools

    from torch.optim.lr_scheduler import CosineAnnealingLR

    data = datasets.synthetic_classification(64, 12, 3, seed=5)  # 4 minibatches per worker and epoch
    shards = split_examples([data], BATCH, 2, None)
    sgd = functools.partial(torch.optim.SGD, lr=0.3)
    net = Network(models.mlp(12, 16, 3), updater=sgd, seed=0, lr_scheduler=lambda o: CosineAnnealingLR(o, T_max=6))
    module = net.copy().module
    opt = sgd(module.parameters())
    scheduler = CosineAnnealingLR(opt, T_max=6)
    fixed = net.copy().module
    for _ in range(2):
        for t in range(4):
            for m, o in ((module, opt), (fixed, None)):
                grads = []
                for shard in shards:
                    m.zero_grad()
                    torch.nn.functional.cross_entropy(m(shard[t].features), shard[t].labels).backward()
                    grads.append([p.grad.clone() for p in m.parameters()])
                lr = opt.param_groups[0]["lr"] if o is not None else 0.3
                with torch.no_grad():
                    for i, p in enumerate(m.parameters()):
                        p -= lr * (grads[0][i] + grads[1][i]) / 2
            opt.zero_grad()  # no gradients: the step below only keeps PyTorch's step-order check quiet
            opt.step()
            scheduler.step()
    ParallelWrapper(
        net, num_workers=2, training_mode="averaging", averaging_frequency=1, threads_per_worker=1, progress=False
    ).fit(data, epochs=2, batch_size=BATCH)
    want = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    unscheduled = torch.cat([p.detach().reshape(-1) for p in fixed.parameters()])
    torch.testing.assert_close(net.params(), want, rtol=0, atol=1e-6)
    assert not torch.allclose(net.params(), unscheduled, atol=1e-4), "the schedule must matter"
    assert net.iteration == 8 and net.current_lr() == pytest.approx(scheduler.get_last_lr()[0])


def test_one_worker_equals_one_process_with_a_torch_optimizer_and_scheduler() -> None:
    import functools

    from torch.optim.lr_scheduler import OneCycleLR

    data = datasets.synthetic_classification(48, 12, 3, seed=2)

    def network() -> Network:
        return Network(
            models.mlp(12, 16, 3),
            updater=functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01),
            seed=0,
            lr_scheduler=lambda o: OneCycleLR(o, max_lr=0.05, total_steps=18),
        )

    single = network().fit(data, epochs=3, batch_size=BATCH)
    net = network()
    ParallelWrapper(
        net, num_workers=1, training_mode="averaging", averaging_frequency=2, threads_per_worker=1, progress=False
    ).fit(data, epochs=3, batch_size=BATCH)
    torch.testing.assert_close(net.params(), single.params(), rtol=0, atol=1e-6)
    torch.testing.assert_close(net.updater_state(), single.updater_state(), rtol=0, atol=1e-6)
    assert net.iteration == single.iteration == 18 and net.current_lr() == single.current_lr()


@pytest.mark.timeout(900)
def test_a_resumed_fit_continues_the_torch_schedule_where_the_checkpoint_cut_it(tmp_path) -> None:
    """A fit interrupted inside its last epoch and resumed by run id ends with the parameters, updater state and
    learning rate of the uninterrupted fit: the resumed workers' schedulers start at the checkpoint's step."""
    import functools

    from _resume_driver import data
    from torch.optim.lr_scheduler import CosineAnnealingLR

    from interrupting import InterruptingMLP
    from torchspark.errors import WorkerError
    from torchspark.training.checkpoint import newest_checkpoint, store

    def fit(after: int | None, directory: str | None) -> Network:
        net = Network(
            InterruptingMLP(12, 16, 3, after=after),
            updater=functools.partial(torch.optim.Adam, lr=0.01),
            seed=0,
            lr_scheduler=functools.partial(CosineAnnealingLR, T_max=18),
        )
        checkpoints = {} if directory is None else {"checkpoint_directory": directory, "checkpoint_every": 1}
        ParallelWrapper(
            net,
            num_workers=2,
            training_mode="averaging",
            averaging_frequency=3,
            threads_per_worker=1,
            progress=False,
            **checkpoints,
        ).fit(data(), epochs=3, batch_size=16, run_id=None if directory is None else "r1")
        return net

    want = fit(None, None)  # 6 minibatches per worker and epoch: 18 steps of the cosine
    directory = str(tmp_path / "ckpt")
    with pytest.raises(WorkerError, match="worker stopped after 16 minibatches"):
        fit(16, directory)
    cut = newest_checkpoint(directory, "r1")
    done = store.read_rank_file(cut.path, 0)[1]["done"]
    assert cut.manifest["fit_epoch"] == 2 and 0 < done < 6
    got = fit(6 - done, directory)  # only the minibatches left are trained
    torch.testing.assert_close(got.params(), want.params(), rtol=0, atol=1e-6)
    torch.testing.assert_close(got.updater_state(), want.updater_state(), rtol=0, atol=1e-6)
    assert got.iteration == want.iteration == 18
    assert got.current_lr() == want.current_lr() == pytest.approx(0.0)  # the end of the cosine
