"""Distributed evaluation: fill several mergeable evaluations in one pass over data that lives in Spark.

DL4J's ``SparkDl4jMultiLayer.doEvaluation`` / ``evaluate*`` in Python:

1. the network travels to the executors once, as a blueprint (`torchspark.spark.shipped`: a broadcast on a
   classic session; the task's closure or a session artifact on Spark Connect);
2. each partition is re-batched to ``batch_size`` examples and fills fresh, empty copies of the evaluations with
   a network leased from the executor process's `NetworkCache` (one copy per Python worker, reused by
   later tasks in the same process);
3. each partition returns its evaluations as JSON (no pickle), merged with
   [`merge`][torchspark.evaluation.BaseEvaluation.merge], which is exact for counts (accuracy, confusion matrix,
   binned ROC), so the result equals one local pass over the same data;
4. the merged result is added into the evaluation objects the caller passed, which are returned.

Two routes: an RDD (of DataSets, batch bytes or paths) and batch files on a classic session run ``mapPartitions``
and ``treeAggregate``; a DataFrame (on any session) and batch files on a Spark Connect session run one
``mapInArrow`` job whose rows are the partial evaluations (`torchspark.spark.frame_jobs`), so no RDD is needed.
The executor-side helpers (`batch_items`, `load_evaluation_item`) live in `torchspark.spark.eval_inputs`,
shared with `torchspark.spark.inference`. The public methods are `SparkNetwork`'s
(`torchspark.spark.evaluation_methods`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torchspark.data import Columns
from torchspark.data.columns import DEFAULT_COLUMNS
from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import BaseEvaluation, evaluation_from_json
from torchspark.nn import Network
from torchspark.nn.outputs import check_output_index, default_targets
from torchspark.spark import jobs
from torchspark.spark.dataframes import classification_outputs
from torchspark.spark.eval_inputs import batch_items, load_evaluation_item
from torchspark.spark.frame_jobs import evaluate_batches, evaluate_frame, merge_jsons
from torchspark.spark.frames import frame_data, is_dataframe
from torchspark.spark.session import spark_context
from torchspark.spark.session_kinds import is_connect_session
from torchspark.spark.shipped import ShippedNetwork, ship_network, ship_to_session
from torchspark.validation import check_int

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 64  # DL4J's DEFAULT_EVAL_SCORE_BATCH_SIZE
DEFAULT_ROC_THRESHOLD_STEPS = 32  # DL4J's DEFAULT_ROC_THRESHOLD_STEPS


# ------------------------------------------------------------------ evaluation
_Partial = tuple[int, "list[str] | None"]  # (examples, evaluation JSONs); (0, None) is the neutral element


def _evaluate_partition(
    shipped: ShippedNetwork,
    templates: list[str],
    batch_size: int,
    targets: list[int],
    loader: Callable[[str], Any] | None = None,
) -> Callable[[Iterable[Any]], Iterator[_Partial]]:
    def run(items: Iterable[Any]) -> Iterator[_Partial]:
        found = evaluate_batches(
            shipped, (load_evaluation_item(i, loader) for i in items), templates, batch_size, targets
        )
        if found is not None:
            yield found

    return run


def _merge_partials(a: _Partial, b: _Partial) -> _Partial:
    if a[1] is None:
        return b
    if b[1] is None:
        return a
    return a[0] + b[0], merge_jsons(a[1], b[1])


def do_evaluation(
    sc: Any,
    network: Network,
    data: Any,
    *evaluations: BaseEvaluation,
    batch_size: int = DEFAULT_BATCH_SIZE,
    columns: Columns = DEFAULT_COLUMNS,
    output_index: int = 0,
    loader: Callable[[str], Any] | None = None,
    _targets: Sequence[int] | None = None,
) -> Any:
    """Fill several evaluations in one distributed pass over ``data`` (DL4J's ``doEvaluation``).

    Args:
        sc: SparkContext, SparkSession or Spark Connect session (a DataFrame is evaluated on its own session).
        network: the network to evaluate (output ``output_index`` against the labels of that index).
        data: an RDD of DataSet/MultiDataSet (any sizes), a DataFrame (its ``columns`` read), or batch-file paths
            (a directory, a glob, a list of str, or an RDD of str). On a Spark Connect session: a DataFrame or batch-file paths (not an RDD); the evaluations
            come back as one JSON row per partition.
        *evaluations: evaluation objects such as ``Evaluation()``, ``ROC(32)``; each partition fills fresh copies
            made from their settings, and the merged result is added into these objects.
        batch_size: examples per forward pass on the executors; bigger is faster until memory runs out. 64 is
            DL4J's default; 256-1024 suits small networks.
            Network copies per executor equal its running tasks (``spark.executor.cores / spark.task.cpus``):
            raise ``spark.task.cpus`` to run fewer, larger evaluation tasks when networks are big.
        columns: the DataFrame's columns (DataFrame input only; lists of columns give several inputs / outputs).
        output_index: which output of a several-output network every evaluation looks at (DL4J's
            ``evaluate(data, outputIndex)``); `evaluate` without it fills one evaluation per output.
        loader: ``fn(path) -> DataSet | MultiDataSet`` for files that are not batch files (images, CSV shards), as
            in ``fit_paths``: ``data`` must be paths (a directory then means every non-hidden file in it) or an
            RDD of paths. It runs on the executors, once per file (evaluation needs no example counts first), and
            must be picklable (a module-level function, or a closure Spark's cloudpickle can ship).
    Returns:
        the evaluation when one is given, else a tuple in the order given.
    Raises:
        ConfigError: no evaluations, a non-evaluation argument, a bad ``batch_size``, or a ``loader`` that is not
            a function or comes with a DataFrame.
        DataError: the data is empty, a DataFrame column is missing, or an executor found bad data (the message
            carries the executor's traceback), e.g. a loader that returned something other than a DataSet.
        WorkerError: any other executor failure.
    """
    check_int("batch_size", batch_size, 1)
    if not evaluations:
        raise ConfigError(
            "do_evaluation needs at least one evaluation, e.g. do_evaluation(sc, net, data, "
            "Evaluation(), ROCMultiClass(32))"
        )
    for ev in evaluations:
        if not isinstance(ev, BaseEvaluation):
            raise ConfigError(f"evaluations must be torchspark.evaluation objects, got {type(ev).__name__}")
    check_output_index(network, output_index)
    targets = list(_targets) if _targets is not None else [output_index] * len(evaluations)
    templates = [ev.to_json() for ev in evaluations]
    names = ", ".join(type(ev).__name__ for ev in evaluations)
    if is_dataframe(data) or is_connect_session(sc):
        count, jsons = _evaluate_frame(
            sc,
            network,
            data,
            templates,
            batch_size,
            targets,
            columns,
            loader,
            f"torchspark evaluate: {names}",
        )
    else:
        count, jsons = _evaluate_rdd(
            spark_context(sc),
            network,
            data,
            templates,
            batch_size,
            targets,
            columns,
            loader,
            f"torchspark evaluate: {names}",
        )
    if jsons is None or count == 0:
        raise DataError("evaluation got no data: the RDD, DataFrame or path list holds no examples")
    for ev, text in zip(evaluations, jsons):
        ev.merge(evaluation_from_json(text))
    log.debug("evaluated %d examples (%s)", count, names)
    return evaluations[0] if len(evaluations) == 1 else tuple(evaluations)


def _evaluate_rdd(
    sc: Any,
    network: Network,
    data: Any,
    templates: list[str],
    batch_size: int,
    targets: list[int],
    columns: Columns,
    loader: Callable[[str], Any] | None,
    description: str,
) -> _Partial:
    """The classic route: an RDD (or paths parallelized) through ``mapPartitions`` and ``treeAggregate``."""
    rdd = batch_items(sc, data, columns, classification_outputs(network), loader)
    shipped = ship_network(sc, network)
    try:
        return jobs.run_job(
            sc,
            description,
            lambda: rdd.mapPartitions(
                _evaluate_partition(shipped, templates, batch_size, targets, loader)
            ).treeAggregate((0, None), _merge_partials, _merge_partials),
            "torchspark-eval-job",
        )
    finally:
        shipped.release()


def _evaluate_frame(
    spark: Any,
    network: Network,
    data: Any,
    templates: list[str],
    batch_size: int,
    targets: list[int],
    columns: Columns,
    loader: Callable[[str], Any] | None,
    description: str,
) -> _Partial:
    """The DataFrame route (any session; batch files too on Spark Connect): one ``mapInArrow`` job."""
    session = data.sparkSession if is_dataframe(data) else spark
    frame = frame_data(session, data, columns, classification_outputs(network), loader)
    shipped = ship_to_session(session, network)
    try:
        return evaluate_frame(shipped, frame, templates, batch_size, targets, description)
    finally:
        shipped.release()


def evaluate(
    sc: Any,
    network: Network,
    data: Any,
    batch_size: int = DEFAULT_BATCH_SIZE,
    columns: Columns = DEFAULT_COLUMNS,
    labels: Sequence[str] | None = None,
    output_index: int | None = None,
    loader: Callable[[str], Any] | None = None,
) -> Any:
    """The evaluation that fits the network's loss (``Evaluation`` for cross-entropy), filled on ``data``.

    Args:
        labels: class names for ``Evaluation.stats()`` (classification networks only).
        output_index: evaluate this output only; None with a network of one loss per output (several losses)
            fills one evaluation per output in one pass and returns them as a list (``evals[k]``: output ``k``).
        Other arguments: as for `do_evaluation`.
    """
    evs, targets = default_targets(network, (), output_index)
    if labels is not None:
        if not all(hasattr(ev, "labels") for ev in evs):
            raise ConfigError(
                f"labels= applies to classification networks; this one evaluates with "
                f"{', '.join(type(ev).__name__ for ev in evs)}"
            )
        evs = [type(ev)(labels=list(labels)) for ev in evs]
    out = do_evaluation(
        sc,
        network,
        data,
        *evs,
        batch_size=batch_size,
        columns=columns,
        loader=loader,
        _targets=targets,
    )
    return list(out) if len(evs) > 1 else out
