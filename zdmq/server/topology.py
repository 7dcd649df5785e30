"""The cluster map as one node process holds it (docs/design.md §19).

Every node starts from the map cluster.yaml makes (`ClusterMap.initial`, epoch 1), or
from the newest map it learned before it stopped (`cluster-map.json` in its data
directory). The map's own record lives in the log of its *home group* (the map's first
group, which never changes): a change is a `MapEntry` proposed there, applied by each
member only if it was made from the map the group holds (compare-and-set on the epoch),
so of two operators' changes one wins and the other is told to retry. Every other node
learns a newer map when it sees a newer epoch (every reply carries `zdmq-epoch`), from
the home group's leader, which sends each new map to every node it names, and at start
from the nodes it knows.

`Topology` is that holder: the current map, the URL of every node it names (a dict the
node's pools and routers read, changed in place), and the callbacks that follow a new
map. Pure but for the file it keeps.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zdmq.cluster_map import ClusterMap, MapError, initial_map
from zdmq.config import ClusterConfig

__all__ = ["EPOCH_HEADER", "MAP_PREFIX", "MapEntry", "Topology", "map_of_view"]

log = logging.getLogger(__name__)

# Every reply of a node names the epoch of the map it was served under; a caller that
# holds an older map refetches it (`GET /v1/cluster`).
EPOCH_HEADER = "zdmq-epoch"
# A log entry of the home group that holds a map (not a command of the state machine).
MAP_PREFIX = b"\xc1zdmq-map:"
MAP_FILE = "cluster-map.json"


def map_of_view(view: Any) -> ClusterMap:
    """The map of a `GET /v1/cluster` reply (its limits and URLs left out); MapError,
    or KeyError / TypeError, for a reply that is not one."""
    out = {k: v for k, v in view.items() if k != "limits"}
    out["nodes"] = [{"id": n["id"], "address": n["address"]} for n in view["nodes"]]
    return ClusterMap.from_dict(out)


class MapEntry:
    """A change of the map in the home group's log: `new`, made from the map of epoch
    `expect` (applied only where the group still holds that epoch)."""

    __slots__ = ("expect", "new")

    def __init__(self, expect: int, new: ClusterMap) -> None:
        self.expect, self.new = expect, new

    def encode(self) -> bytes:
        body = {"expect": self.expect, "map": self.new.to_dict()}
        return MAP_PREFIX + json.dumps(body, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes) -> MapEntry | None:
        """The entry `data` holds, or None for any other entry."""
        if not data.startswith(MAP_PREFIX):
            return None
        raw = json.loads(data[len(MAP_PREFIX) :])
        return MapEntry(int(raw["expect"]), ClusterMap.from_dict(raw["map"]))


class Topology:
    """The newest cluster map this process knows, and the node URLs it names."""

    def __init__(self, config: ClusterConfig, data_dir: Path | None = None) -> None:
        self.config = config
        self._scheme = "https" if config.tls is not None else "http"
        self._path = data_dir / MAP_FILE if data_dir is not None else None
        self.map = initial_map(config)
        #: node id -> base URL, for every node of the map (and of the maps before it: a
        #: node that left may still be asked for what it knew). Changed in place.
        self.urls: dict[str, str] = {}
        self._listeners: list[Callable[[ClusterMap], None]] = []
        self._set_urls(self.map)
        saved = self._load()
        if saved is not None and saved.epoch > self.map.epoch:
            self.map = saved
            self._set_urls(saved)

    @property
    def epoch(self) -> int:
        return self.map.epoch

    @property
    def home(self) -> str:
        """The group whose log keeps the map."""
        return self.map.groups[0]

    def url(self, address: str) -> str:
        return f"{self._scheme}://{address}"

    def on_change(self, listener: Callable[[ClusterMap], None]) -> None:
        self._listeners.append(listener)

    def adopt(self, new: ClusterMap) -> bool:
        """Takes `new` if it is newer than the map held (and fits this cluster): keeps it
        on disk, updates the URLs and tells the listeners. Returns whether it did."""
        if new.epoch <= self.map.epoch:
            return False
        old = self.map
        if new.partitions != old.partitions or new.groups != old.groups:
            log.error(
                "a map of epoch %d changes the partitions or the groups of this cluster: not taken",
                new.epoch,
            )
            return False
        self.map = new
        self._set_urls(new)
        self._save(new)
        log.info("cluster map epoch %d: %d nodes", new.epoch, len(new.nodes))
        for listener in self._listeners:
            listener(new)
        return True

    def _set_urls(self, m: ClusterMap) -> None:
        for node, address in m.nodes.items():
            self.urls[node] = self.url(address)

    def _load(self) -> ClusterMap | None:
        if self._path is None or not self._path.exists():
            return None
        try:
            return ClusterMap.from_dict(json.loads(self._path.read_text()))
        except (OSError, ValueError, MapError) as e:
            log.error("%s: not a cluster map (%s): starting from cluster.yaml's", self._path, e)
            return None

    def _save(self, m: ClusterMap) -> None:
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_name(MAP_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(m.to_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def view(self) -> dict[str, Any]:
        """`GET /v1/cluster`'s map part: the map, with each node's URL."""
        body = self.map.to_dict()
        for n in body["nodes"]:
            n["url"] = self.url(n["address"])
        return body
