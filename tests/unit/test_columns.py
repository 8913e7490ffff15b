"""`Columns`: the columns of a DataFrame that feed a network, checked when made, and the choice between it and the
flat ``features_col=``/``label_col=``/``feature_shape=`` keywords (no Spark needed)."""

from __future__ import annotations

import pytest

from torchspark.data import Columns
from torchspark.errors import ConfigError


def test_defaults_and_readers() -> None:
    c = Columns()
    assert (c.feature_names, c.label_names, c.shapes, c.several) == (["features"], ["label"], [None], False)
    img = Columns("img", "digit", [1, 28, 28])
    assert img.feature_shape == (1, 28, 28) and img.shapes == [(1, 28, 28)]
    assert img.without_label().label_names == [] and img.without_label().shapes == [(1, 28, 28)]
    assert Columns(feature_shape=()).feature_shape is None  # () keeps the rows flat, as None does


def test_lists_become_tuples_and_make_several_inputs() -> None:
    c = Columns(["a", "b"], ["cls", "reg"], [(1, 8, 8), None])  # type: ignore[arg-type]
    assert c.features == ("a", "b") and c.label == ("cls", "reg")
    assert c.shapes == [(1, 8, 8), None] and c.several
    assert c == Columns(("a", "b"), ("cls", "reg"), ((1, 8, 8), None))
    assert hash(c) == hash(Columns(("a", "b"), ("cls", "reg"), ((1, 8, 8), None)))  # a cache key
    assert Columns(["x"]).several and not Columns("x", None).several
    assert Columns("x", ["y"]).several  # type: ignore[arg-type]
    assert Columns(["x", "y"], "x").names == ["x", "y"]  # each column once


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"features": ""}, "features must be a column name, got an empty string"),
        ({"features": []}, r"features must be a column name or a non-empty list of column names, got \[\]"),
        ({"features": ["a", 3]}, r"got \['a', 3\]"),
        ({"features": 7}, "got 7"),
        ({"label": [""]}, r"label must be a column name or a non-empty list"),
        ({"feature_shape": (1, 0, 3)}, r"feature_shape must be a shape of integers >= 1 .* got \(1, 0, 3\)"),
        ({"feature_shape": (True, 2)}, "feature_shape must be a shape"),
        ({"feature_shape": "1,28,28"}, "feature_shape must be a shape"),
        ({"features": ["a", "b"], "feature_shape": (1, 8, 8)}, r"one shape but there are 2 features columns"),
        ({"features": ["a", "b"], "feature_shape": [(1, 8, 8)]}, r"feature_shape has 1 entries but there are 2"),
        ({"features": ["a", "b"], "feature_shape": [(1, 8, 8), (0,)]}, r"got \(0,\) in"),
    ],
)
def test_bad_values_are_refused_when_made(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        Columns(**kwargs)


def test_of_takes_the_flat_keywords_or_one_value() -> None:
    assert Columns.of() == Columns()
    assert Columns.of(None, "x", None, (2, 3)) == Columns("x", None, (2, 3))
    given = Columns("x", "y")
    assert Columns.of(given) is given
    # a flat keyword at its default value beside columns= says nothing else: accepted
    assert Columns.of(given, "features", "label", None) is given


@pytest.mark.parametrize(
    ("flat", "named"),
    [
        ({"features_col": "a"}, "features_col='a'"),
        ({"label_col": None}, "label_col=None"),
        ({"feature_shape": (1, 2)}, r"feature_shape=\(1, 2\)"),
    ],
)
def test_columns_and_flat_keywords_together_are_refused(flat, named) -> None:
    with pytest.raises(ConfigError, match=rf"fit: columns=Columns\(.*\) and {named} both name the columns; pass one"):
        Columns.of(Columns("x", "y"), **flat, owner="fit")


def test_columns_of_another_type_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"predict: columns must be a torchspark.data.Columns, got dict"):
        Columns.of({"features": "x"}, owner="predict")  # type: ignore[arg-type]


def test_a_mapping_names_keyword_inputs_with_a_shape_each() -> None:
    cols = Columns({"input_ids": "ids", "attention_mask": "mask"}, "y", {"input_ids": (2, 4)})
    assert cols.keywords == ("input_ids", "attention_mask")
    assert cols.feature_names == ["ids", "mask"] and cols.names == ["ids", "mask", "y"]
    assert cols.shapes == [(2, 4), None] and cols.several
    assert hash(cols) == hash(Columns(cols.features, "y", [(2, 4), None]))  # stored as pairs: hashable, round-trips
    assert cols.without_label().keywords == cols.keywords and cols.without_label().label_names == []
    assert Columns({"input_ids": "ids"}).shapes == [None] and Columns("x").keywords is None
    assert Columns.of(None, {"input_ids": "ids"}, None, {"input_ids": (8,)}) == Columns(
        {"input_ids": "ids"}, None, [(8,)]
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"features": {}}, "got an empty mapping"),
        ({"features": {"input ids": "ids"}}, r"keyword 'input ids' is not a Python identifier"),
        ({"features": {"input_ids": ""}}, r"both non-empty strings"),
        ({"features": {"input_ids": "ids"}, "feature_shape": {"ids": (4,)}}, r"feature_shape names \['ids'\] but"),
        (
            {"features": "ids", "feature_shape": {"input_ids": (4,)}},
            r"is a mapping but features='ids' names no keyword",
        ),
    ],
)
def test_bad_keyword_features_are_refused_when_made(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        Columns(**kwargs)
