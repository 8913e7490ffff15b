"""torchspark._io: filesystems by URL, with a clear error for a missing fsspec backend."""

from __future__ import annotations

import re

import pytest

from torchspark._io import filesystem
from torchspark.errors import ConfigError


@pytest.mark.parametrize("url", ["hdfs://namenode:8020/data", "foo://bucket/data"])
def test_a_missing_filesystem_backend_is_named(url: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(url.split("://")[0])) as info:
        filesystem(url)
    assert "install it" in str(info.value).lower() or "use a local path" in str(info.value).lower()
