"""``SparkNetwork.fit`` on a Spark Connect session: what it accepts, and the workers' data it hands the Connect
runner.

Under Connect a fit takes a DataFrame only (no RDDs, no lists: they need a SparkContext); the master must run on
one barrier stage (``averaging_via="torch"``) with the balanced split (``repartition="always"``,
``repartition_strategy="balanced"``, the defaults) and a worker count that needs no executor inventory
(``num_workers``, or the cluster's default parallelism). ``rdd_training_approach``, ``export_directory`` and
``storage_level`` do not apply: the rows stream from the DataFrame to the workers
(`torchspark.spark.connect.feeding`). Workers always meet through Spark's ``allGather``
(``rendezvous_via`` does not apply: the executors may not reach the client).
"""

from __future__ import annotations

from typing import Any

from torchspark.data import Columns
from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.spark.connect.feeding import ConnectWorkerData, frame_data
from torchspark.spark.connect.jobs import default_parallelism
from torchspark.spark.dataframes import arrow_to_batch, classification_outputs, training_frame
from torchspark.spark.session_kinds import is_connect_session, require_classic, session_kind
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.adapter import check_first_batch
from torchspark.training.hooks import NullRecorder, PhaseRecorder

__all__ = [
    "check_connect_master",
    "check_connect_data",
    "connect_num_workers",
    "connect_fit_data",
    "takes_arrow_route",
    "DATAFRAME_ROUTE",
]

#: how to train on a Connect session, for messages
DATAFRAME_ROUTE = (
    "pass a DataFrame instead: fit(df, features_col=..., label_col=..., feature_shape=...), e.g. "
    "spark.createDataFrame(rows, 'features array<double>, label long')"
)


def takes_arrow_route(spark: Any, master: TrainingMaster, data: Any) -> bool:
    """Whether a fit of ``data`` takes this route: always on a Connect session; on a classic one for a DataFrame
    when the master says ``dataframe_route="barrier_arrow"`` (RDDs and lists always take the RDD routes there)."""
    if is_connect_session(spark):
        return True
    from pyspark.sql import DataFrame

    return master.dataframe_route == "barrier_arrow" and isinstance(data, DataFrame)


def check_connect_master(master: TrainingMaster) -> None:
    """Refuse the master's settings a Connect session cannot run, naming the fix.

    Raises:
        ConfigError: ``averaging_via="spark"``, ``workers_per_node``, ``gpus_per_worker``, or a split other than the balanced one.
    """
    if master.spark_rounds:
        raise ConfigError(
            "averaging_via='spark' runs one Spark job per averaging round over RDDs (treeAggregate), "
            "which a Spark Connect session does not have; use averaging_via='torch' (the default: "
            "the workers all-reduce inside one barrier stage)"
        )
    if master.workers_per_executor is not None:
        raise ConfigError(
            f"workers_per_node={master.workers_per_executor} needs the executor count from a "
            "SparkContext, which a Spark Connect session does not have; set num_workers instead"
        )
    if master.gpus_per_worker is not None:
        raise ConfigError(
            f"gpus_per_worker={master.gpus_per_worker} asks a stage-level resource profile, which the "
            "Spark Connect route does not attach yet; give every task its GPUs through the server's "
            "session settings instead (spark.executor.resource.gpu.amount and "
            "spark.task.resource.gpu.amount): each worker then trains on the GPU Spark assigned to it"
        )
    if master.repartition != "always" or master.repartition_strategy != "balanced":
        raise ConfigError(
            f"on a Spark Connect session the data is always split evenly over the workers, got "
            f"repartition={master.repartition!r}, repartition_strategy={master.repartition_strategy!r}; "
            "use repartition='always', repartition_strategy='balanced' (the defaults)"
        )


def check_connect_data(spark: Any, data: Any) -> None:
    """Refuse training data the route cannot read: anything but a DataFrame of the session's kind (Connect, or
    classic with ``dataframe_route="barrier_arrow"``).

    Raises:
        ConfigError: an RDD, a list or another object (naming the DataFrame route), or a classic session's
            DataFrame.
    """
    from pyspark.sql import DataFrame

    if not isinstance(data, DataFrame):
        require_classic(spark, f"training on a {type(data).__name__}", DATAFRAME_ROUTE)
    if is_connect_session(data) != is_connect_session(spark):
        raise ConfigError(
            f"this DataFrame belongs to {session_kind(data.sparkSession)}, but the SparkNetwork "
            f"was built on {session_kind(spark)}; create the DataFrame with the session the "
            "SparkNetwork was built on"
        )


def connect_num_workers(spark: Any, master: TrainingMaster) -> int:
    """The master's ``num_workers``, else the cluster's default parallelism (one small query)."""
    return master.num_workers or default_parallelism(spark)


def connect_fit_data(
    spark: Any,
    network: Network,
    data: Any,
    master: TrainingMaster,
    epochs: int,
    *,
    columns: Columns,
    recorder: PhaseRecorder | None = None,
) -> ConnectWorkerData:
    """The workers' data of a fit on a Connect session: the checks above, the DataFrame's checked columns, the
    balanced plan (`frame_data`) and a check of the first rows on the
    client (a wrong shape fails here, before any worker starts).

    Raises:
        ConfigError: what `check_connect_master` and `check_connect_data` refuse.
        DataError: missing or mistyped columns, nulls, ragged arrays, no rows, data the network cannot take.
    """
    recorder = NullRecorder() if recorder is None else recorder
    check_connect_master(master)
    check_connect_data(spark, data)
    frame = training_frame(data, columns)
    n = connect_num_workers(spark, master)
    labels = classification_outputs(network)
    with recorder.phase("count"):
        prepared = frame_data(
            spark,
            frame,
            columns=columns,
            integer_labels=labels,
            batch_size=master.batch_size_per_worker,
            num_workers=n,
            rng_seed=master.rng_seed,
            epochs=epochs,
            first_epoch=network.epoch,
            drop_last=master.drop_last,
            shuffle_scope=master.shuffle_scope,
        )
    sample = frame.limit(4).toArrow()
    if sample.num_rows:
        check_first_batch(network, arrow_to_batch(columns, labels)(sample))
    return prepared
