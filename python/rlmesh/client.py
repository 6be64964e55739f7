"""The client: thin wrappers over the Coordinator and ReplayBuffer RPCs.

Every call carries a deadline (`timeout`, seconds) and, when the cluster
was started with --auth_token_file, the bearer token. Results are plain
dicts and lists (proto field names, every field present, 64-bit integers
as ints), so `pandas.DataFrame(c.metrics(exp))` works without conversion.
Errors are RlmeshError with the gRPC code and the server's message.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import grpc
from google.protobuf.message import Message

from rlmesh.proto import common_pb2, coordinator_pb2, coordinator_pb2_grpc
from rlmesh.proto import replay_buffer_pb2, replay_buffer_pb2_grpc

TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")


class RlmeshError(RuntimeError):
    """An RPC failed. `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        super().__init__(f"{method}: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


def to_dict(msg: Message) -> Dict[str, Any]:
    """Every field of `msg` (defaults included) by its proto name; enums by name."""
    out: Dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == 3
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value_field = f.message_type.fields_by_name["value"]
            out[f.name] = {k: (to_dict(v) if value_field.message_type is not None else v) for k, v in value.items()}
        elif repeated:
            out[f.name] = [_scalar(f, v) for v in value]
        else:
            out[f.name] = _scalar(f, value)
    return out


def _scalar(f, value):
    if f.message_type is not None:
        return to_dict(value)
    if f.enum_type is not None:
        return f.enum_type.values_by_number[value].name if value in f.enum_type.values_by_number else value
    return value


class _Rpc:
    """A channel with the deadline and the token every call takes."""

    def __init__(self, address: str, token: Optional[str], timeout: float, root_certificates: Optional[bytes]):
        if not address:
            raise ValueError("address: empty")
        if root_certificates is not None:
            self.channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates))
        else:
            self.channel = grpc.insecure_channel(address)
        self.address = address
        self.token = token
        self.timeout = timeout

    def call(self, stub_method, name: str, request, timeout: Optional[float] = None):
        metadata = [("authorization", f"Bearer {self.token}")] if self.token else None
        try:
            return stub_method(request, timeout=timeout or self.timeout, metadata=metadata)
        except grpc.RpcError as e:  # every RPC error is a grpc.Call too
            raise RlmeshError(name, e.code(), e.details()) from None

    def stream(self, stub_method, name: str, request, timeout: Optional[float] = None):
        metadata = [("authorization", f"Bearer {self.token}")] if self.token else None
        try:
            yield from stub_method(request, timeout=timeout or self.timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise RlmeshError(name, e.code(), e.details()) from None


def _filter(experiment_id: str, min_step: int = 0, max_step: int = 0, min_policy_version: int = 0,
            max_policy_version: int = 0, min_reward: Optional[float] = None, max_reward: Optional[float] = None,
            finish_reason: Optional[str] = None, prompt_id: str = "",
            text_contains: str = "") -> replay_buffer_pb2.TrajectoryFilter:
    if not experiment_id:
        raise ValueError("experiment_id: empty")
    f = replay_buffer_pb2.TrajectoryFilter(experiment_id=experiment_id, min_step=min_step, max_step=max_step,
                                           min_policy_version=min_policy_version,
                                           max_policy_version=max_policy_version, prompt_id=prompt_id,
                                           text_contains=text_contains)
    if min_reward is not None or max_reward is not None:
        f.has_reward_range = True
        # The buffer takes finite bounds only: an open end is the largest double.
        f.min_reward = -sys.float_info.max if min_reward is None else min_reward
        f.max_reward = sys.float_info.max if max_reward is None else max_reward
    if finish_reason is not None:
        name = finish_reason.upper()
        if not name.startswith("FINISH_REASON_"):
            name = "FINISH_REASON_" + name
        try:
            f.finish_reason = common_pb2.FinishReason.Value(name)
        except ValueError:
            raise ValueError(f"finish_reason: unknown value {finish_reason!r} "
                             f"(one of: {', '.join(common_pb2.FinishReason.keys())})") from None
    return f


class Buffer:
    """The replay buffer: what the policy generated and was trained on."""

    _EXPORT_FORMATS = {"trajectories": replay_buffer_pb2.EXPORT_TRAJECTORIES,
                       "sft": replay_buffer_pb2.EXPORT_SFT, "dpo": replay_buffer_pb2.EXPORT_DPO}

    def __init__(self, address: str, token: Optional[str] = None, timeout: float = 30.0,
                 root_certificates: Optional[bytes] = None):
        self._rpc = _Rpc(address, token, timeout, root_certificates)
        self._stub = replay_buffer_pb2_grpc.ReplayBufferStub(self._rpc.channel)

    @property
    def address(self) -> str:
        return self._rpc.address

    def query(self, experiment_id: str, *, limit: Optional[int] = None, page_size: int = 100,
              **filter_fields) -> Iterator[Dict[str, Any]]:
        """Trajectories matching the filter, in (step, group, sample) order, fetched a page at a time.

        Filter keywords: min_step, max_step, min_policy_version, max_policy_version, min_reward,
        max_reward, finish_reason ("eos", "length", ...), prompt_id, text_contains.
        """
        if page_size <= 0 or page_size > 10000:
            raise ValueError(f"page_size: {page_size} is outside [1, 10000]")
        f = _filter(experiment_id, **filter_fields)
        token, returned = "", 0
        while True:
            want = page_size if limit is None else min(page_size, limit - returned)
            if want <= 0:
                return
            resp = self._rpc.call(self._stub.Query, "ReplayBuffer.Query",
                                  replay_buffer_pb2.QueryRequest(filter=f, limit=want, page_token=token))
            for t in resp.trajectories:
                yield to_dict(t)
                returned += 1
            token = resp.next_page_token
            if not token or not resp.trajectories:
                return

    def aggregates(self, experiment_id: str, **filter_fields) -> List[Dict[str, Any]]:
        """Per-step reward mean/sd, pass@k, zero-variance rate and lengths of everything matched."""
        resp = self._rpc.call(self._stub.Query, "ReplayBuffer.Query",
                              replay_buffer_pb2.QueryRequest(filter=_filter(experiment_id, **filter_fields), limit=1,
                                                             with_aggregates=True))
        return [to_dict(a) for a in resp.aggregates]

    def stats(self, experiment_id: str = "") -> List[Dict[str, Any]]:
        resp = self._rpc.call(self._stub.Stats, "ReplayBuffer.Stats",
                              replay_buffer_pb2.StatsRequest(experiment_id=experiment_id))
        return [to_dict(e) for e in resp.experiments]

    def store_memory(self) -> Dict[str, int]:
        """The store's memory by RocksDB's accounting, bytes: block_cache_usage (bounded by
        block_cache_capacity), memtables, table_readers."""
        resp = self._rpc.call(self._stub.Stats, "ReplayBuffer.Stats", replay_buffer_pb2.StatsRequest())
        return to_dict(resp.memory)

    def export(self, experiment_id: str, format: str = "trajectories", path: Optional[str] = None,
               timeout: float = 600.0, **filter_fields) -> Union[List[Dict[str, Any]], int]:
        """JSONL records (format "trajectories", "sft" or "dpo"). With `path`, writes them to that file
        (through a temporary file renamed at the end, so a failed export leaves no partial file) and
        returns the record count; without, returns the records as dicts."""
        if format not in self._EXPORT_FORMATS:
            raise ValueError(f"format: unknown {format!r} (one of: {', '.join(self._EXPORT_FORMATS)})")
        req = replay_buffer_pb2.ExportRequest(filter=_filter(experiment_id, **filter_fields),
                                              format=self._EXPORT_FORMATS[format])
        chunks = self._rpc.stream(self._stub.Export, "ReplayBuffer.Export", req, timeout=timeout)
        if path is None:
            out: List[Dict[str, Any]] = []
            for c in chunks:
                out.extend(json.loads(line) for line in c.jsonl.decode().splitlines() if line)
            return out
        tmp = f"{path}.tmp-{os.getpid()}"
        records = 0
        try:
            with open(tmp, "wb") as fh:
                for c in chunks:
                    fh.write(c.jsonl)
                    records += c.records
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return records


class Client:
    """A running coordinator (`coordinator launch`)."""

    def __init__(self, address: str, token: Optional[str] = None, timeout: float = 30.0,
                 root_certificates: Optional[bytes] = None):
        self._rpc = _Rpc(address, token, timeout, root_certificates)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._rpc.channel)
        self._root_certificates = root_certificates

    def submit(self, experiment: Union[str, os.PathLike, Dict[str, Any]],
               overrides: Sequence[str] = ()) -> str:
        """Submits an experiment; returns its id.

        `experiment` is a YAML file path, YAML text, or a dict of the same shape. The coordinator parses
        and validates it (errors name the field and line); `overrides` are `--set`-style
        "a.b[0].c=value" strings. Paths inside the config are read on the coordinator's host.
        """
        if isinstance(experiment, dict):
            import yaml
            text = yaml.safe_dump(experiment, sort_keys=False)
        else:
            s = os.fspath(experiment)
            if "\n" not in s and os.path.isfile(s):
                with open(s, encoding="utf-8") as fh:
                    text = fh.read()
            elif "\n" in s or ":" in s:
                text = s
            else:
                raise FileNotFoundError(f"experiment: no such file {s!r}")
        req = coordinator_pb2.SubmitRequest(source_yaml=text, overrides=list(overrides))
        return self._rpc.call(self._stub.Submit, "Coordinator.Submit", req).experiment_id

    def status(self, experiment_id: str = "") -> Dict[str, Any]:
        """{"experiment": {...} or None, "roles": [...]}; empty id = the newest experiment."""
        resp = self._rpc.call(self._stub.GetStatus, "Coordinator.GetStatus",
                              coordinator_pb2.StatusRequest(experiment_id=experiment_id))
        return {"experiment": to_dict(resp.experiment) if resp.HasField("experiment") else None,
                "roles": [to_dict(r) for r in resp.roles]}

    def list(self) -> List[Dict[str, Any]]:
        resp = self._rpc.call(self._stub.List, "Coordinator.List", coordinator_pb2.ListRequest())
        return [to_dict(e) for e in resp.experiments]

    def cancel(self, experiment_id: str) -> str:
        """Cancels an experiment; returns its state afterwards."""
        resp = self._rpc.call(self._stub.Cancel, "Coordinator.Cancel",
                              coordinator_pb2.CancelRequest(experiment_id=experiment_id))
        return resp.state

    def metrics(self, experiment_id: str = "", event: Optional[str] = None,
                page_size: int = 1000) -> List[Dict[str, Any]]:
        """Every metric record written so far (metrics.jsonl), one dict per step or eval;
        `event="step"` or `"eval"` keeps one kind."""
        records: List[Dict[str, Any]] = []
        start = 0
        while True:
            resp = self._rpc.call(self._stub.GetMetrics, "Coordinator.GetMetrics",
                                  coordinator_pb2.MetricsRequest(experiment_id=experiment_id, from_record=start,
                                                                 limit=page_size))
            for line in resp.records:
                r = json.loads(line)
                if event is None or r.get("event") == event:
                    records.append(r)
            if not resp.records or resp.next_record <= start:
                return records
            start = resp.next_record

    def wait(self, experiment_id: str, timeout: float = 3600.0, poll: float = 1.0) -> Dict[str, Any]:
        """Polls until the experiment is SUCCEEDED, FAILED or CANCELLED; returns its status.
        Raises TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            e = self.status(experiment_id)["experiment"]
            if e is not None and e["state"] in TERMINAL_STATES:
                return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"experiment {experiment_id} still {e and e['state']} after {timeout} s")
            time.sleep(poll)

    def buffer(self) -> Buffer:
        """The cluster's replay buffer, found from the coordinator's role list."""
        for r in self.status()["roles"]:
            if r["role"] == "ROLE_REPLAY_BUFFER" and r["address"]:
                return Buffer(r["address"], self._rpc.token, self._rpc.timeout, self._root_certificates)
        raise RlmeshError("Coordinator.GetStatus", grpc.StatusCode.NOT_FOUND, "no replay buffer among the roles")


def connect(address: str, token: Optional[str] = None, timeout: float = 30.0,
            root_certificates: Optional[bytes] = None) -> Client:
    """A client of the coordinator at `address` ("host:port"). `token` is the bearer token of a cluster
    started with --auth_token_file; `root_certificates` (PEM bytes) switches to TLS."""
    return Client(address, token=token, timeout=timeout, root_certificates=root_certificates)
