"""A node's API server on a free loopback port, serving a populated snapshot: for the API's load and
deadline tests (the server is real; the node behind it is its snapshot)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry

from p2ptrain.daemon.api import ApiServer
from p2ptrain.daemon.control import ControlQueue
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.metrics import build_registry
from p2ptrain.status import LatestSnapshot
from tests.unit.monitoring_fixtures import populated_status, populated_swarm

TOKEN = "t" * 43


def make_server(registry: CollectorRegistry | None = None, **kwargs: Any) -> ApiServer:
    latest = LatestSnapshot()
    latest.publish(populated_status(time.time()), populated_swarm())
    server = ApiServer(host="127.0.0.1", port=0, latest=latest, logs=LogRing(capacity=10), control=ControlQueue(),
                       registry=registry or build_registry(latest), token=TOKEN, **kwargs)
    server.start()
    return server
