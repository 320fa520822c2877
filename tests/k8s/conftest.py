"""One real API server for the session's Kubernetes tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.k8s.cluster import Cluster, start_cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("k8s"))
    yield c
    c.stop()
