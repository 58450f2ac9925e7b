"""Each role's side of a session while it trains and as it ends: the
server's (serve, then its part in :func:`.transitions.end`), a worker's (the
exchange of every step, requests to the servers, its part in the end), and
Horovod's baseline (the workers allreduce among themselves, the server rank
idle).  When a job was asked to stop it ends with status 75 (preempted) once
the checkpoint is written; when a worker was dropped, with status 69."""

from __future__ import annotations

import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..algorithm.server import ParameterServer
from ..algorithm.shards import shard_tensors
from ..common.log import get_logger
from ..common.tensors import snapshot, to_cpu
from ..protocol.stall import StallWatch, stall_timeout_seconds, stall_warning_seconds
from ..protocol.worker import Worker
from ..runtime.exits import PREEMPTED, WORKER_DROPPED, flush
from ..runtime.lifecycle import Lifecycle
from ..runtime.preemption import Preempted, signal_name
from ..runtime.roles import Runtime
from .coordination import Coordination, ModelSplit
from .loop import save, serve
from .messages import ControlRequests, LoadOptimizerState, OptimizerStateWithWeights, SetState
from .transitions import combine_untrained_state, end, end_without_dropped

log = get_logger("session")


class ServerSession:
    """A server's side of a session: serve, end, report.

    Arguments:
        rt: the runtime (its lifecycle is this rank's).
        comm: this server's session with the workers.
        server: the algorithm.
        names: each worker's name for messages.
        coordination: one server's, or several servers'.
        model_params: the model's trained parameters, which take the whole
            model's final weights at the end.
        metrics_dir: ``DistributedOptimizer(metrics_dir=...)``, for the
            serving loop's monitor.
    """

    server_holds_weights = True

    def __init__(self, rt: Runtime, comm: Any, server: ParameterServer, names: List[str],
                 coordination: Coordination, model_params: List[torch.Tensor], metrics_dir: Optional[str] = None):
        self.rt, self.comm, self.server, self.names = rt, comm, server, names
        self.metrics_dir = metrics_dir
        self.coordination, self.model_params = coordination, model_params
        self.lifecycle: Lifecycle = rt.lifecycle
        self.last_checkpoint = None

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: the collectives take no part on the server."""

    def register_untrained_state(self, tensors: List[torch.Tensor]) -> None:
        """Nothing to do: the workers combine their buffers among themselves."""

    def serve(self) -> None:
        """Training: answer pushes until every worker has left."""
        serve(self.server, self.coordination, self.lifecycle, ControlRequests(self.rt.mpi, self.comm, self.server).answer,
              StallWatch(self.names, stall_warning_seconds()), self.metrics_dir)

    def finish(self) -> None:
        """Ending (:func:`.transitions.end`): the final exchange, the last
        checkpoint (the buffers combined, the windows still open: on the CPU
        the backups live in them), the windows freed, the summary; then end
        the job if a worker was dropped."""
        end(self.rt, [self.comm], self)

    # --- this side's part in end() ---
    def begin(self) -> None:
        self.lifecycle.end()

    def leave(self) -> None:
        """Nothing: the serving loop ended when every worker had left."""

    def dropped(self) -> List[int]:
        return [m for m, d in enumerate(self.server.channel.dropped) if d]

    def combine(self, workers: Any) -> None:
        """Nothing: the workers combine their untrained state among themselves."""

    def final_tensors(self, shard: int) -> Tuple[List[torch.Tensor], torch.Tensor, Optional[Dict[str, Any]]]:
        server = self.server
        return list(server.untrained_state.values()), server.weights, snapshot(server.optimizer.state_dict())

    def exchanged(self, shard: int, optimizer_state: Dict[str, Any]) -> None:
        if self.coordination.checkpoints is not None:
            self.last_checkpoint = save(self.server, self.coordination.checkpoints,
                                        self.coordination.last_checkpoint_number())

    def free(self, shard: int) -> None:
        self.server.free()

    def whole_model(self) -> Optional[torch.Tensor]:
        return self.coordination.whole_model_buffer(self.model_params, self.server.weights.dtype)

    def took_whole_model(self, weights: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.model_params:
                p.data = weights[offset:offset + p.numel()].view(p.shape).to(p.device)
                offset += p.numel()

    def close(self, dropped: List[int], comms: List[Any]) -> None:
        server = self.server
        self.coordination.report(server.telemetry)
        if self.lifecycle.stopped:
            saved = f"checkpoint {self.last_checkpoint}" if self.last_checkpoint else \
                "nothing saved (no HVD_DCASGD_CHECKPOINT_DIR)" if self.coordination.checkpoints is None else \
                "its checkpoint could not be written (see the warning above; the previous ones are kept)"
            log.warning(f"{server.telemetry.name}: stopped at update {self.lifecycle.stopped_at}, asked by "
                        f"{signal_name(self.lifecycle.signal)}: {saved}; exit status {PREEMPTED} (preempted): "
                        "run the same command again to resume.")
            flush()
        self.lifecycle.finish()
        if dropped:
            server.telemetry.close()  # the trace's last lines on disk (the windows, kept open, never close it)
            names = ", ".join(self.names[m] for m in dropped)
            end_without_dropped(self.rt, comms[0], f"hvd_dcasgd: {names} stopped pushing and was dropped after "
                                                   f"{stall_timeout_seconds():g} s (HVD_DCASGD_STALL_TIMEOUT); the "
                                                   f"other workers finished; ending the job with status "
                                                   f"{WORKER_DROPPED}.")

    @property
    def exit_status(self) -> int:
        return PREEMPTED if self.lifecycle.stopped else 0


class WorkerSession:
    """A worker's side of a session: the exchange object, and how to finish.
    With several servers, one session per server, finished together."""

    server_holds_weights = True  # broadcasts while training also reach the server

    def __init__(self, rt: Runtime, worker: Worker, untrained_state: Dict[str, torch.Tensor], comms: List[Any],
                 split: ModelSplit, pushes_before: int = 0):
        """``comms[s]`` is server s's session, whose slice of the model is
        ``split.pieces[s]``."""
        self.rt, self.worker, self.untrained_state = rt, worker, untrained_state
        self.comms, self.split = comms, split
        self.lifecycle: Lifecycle = rt.lifecycle
        self.untrained_tensors: List[torch.Tensor] = list(untrained_state.values())
        self.requests = [ControlRequests(rt.mpi, comm) for comm in comms]
        self.finished = False
        self._states: List[Dict[str, Any]] = []  # each server's optimizer state, from the final exchanges
        self.pushes_before = pushes_before  # the data position this job started at (a resumed job)
        self._told_servers = False  # this worker has asked the servers to stop

    @property
    def pushes(self) -> int:
        """This worker's data position: its pushes the server has taken, this job and the ones it resumes (after
        a change of the number of workers, from the even share of everyone's)."""
        return self.pushes_before + self.worker.pushes

    def register_untrained_state(self, tensors: List[torch.Tensor]) -> None:
        """Also combine these (the non-trained entries of a state dict the
        script broadcast) at the end."""
        known = {t.data_ptr() for t in self.untrained_tensors} | {p.data_ptr() for p in self.worker.params}
        self.untrained_tensors += [t for t in tensors if t.data_ptr() not in known and t.numel()]

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Send these state-dict entries to the servers: trained parameters by
        their index in the layout (so no names are needed; each server its
        slice of them), the rest of the model's state by name."""
        index = {p.data_ptr(): i for i, p in enumerate(self.worker.params)}
        params = {index[t.data_ptr()]: t.detach().cpu() for _, t in items if t.data_ptr() in index}
        untrained_state = {n: t.detach().cpu() for n, t in items
                           if n in self.untrained_state and t.data_ptr() not in index}
        for requests, pieces in zip(self.requests, self.split.pieces):
            requests.ask(SetState(shard_tensors(params, pieces), untrained_state))

    def load_optimizer_state(self, state: Dict[str, Any]) -> None:
        """Load an optimizer state on the servers (each its slice of it)."""
        state = to_cpu(state)
        for shard, requests in enumerate(self.requests):
            requests.ask(LoadOptimizerState(self.split.state_for(state, shard)))

    def optimizer_state_with_weights(self) -> Dict[str, Any]:
        """The servers' optimizer state, with the model brought to the weights
        of the same moment (this worker's backup from now on), per server."""
        states = [requests.ask(OptimizerStateWithWeights(self.worker.index)) for requests in self.requests]
        self.worker.read()
        return self.split.whole_state(states)

    def exchange(self) -> None:
        """One step's exchange; then stop the script if the job was asked to
        (a signal here: tell the servers; or the servers' answer said so)."""
        self.worker.exchange()
        signal = self.lifecycle.signal
        if signal is not None and not self._told_servers:
            for channel in self.worker.channels:
                channel.ask_to_stop()
            self._told_servers = True
        if signal is not None or self.worker.stopping:
            self.lifecycle.stop()
            raise Preempted(
                f"hvd_dcasgd: worker {self.worker.index} stops after push {self.pushes - 1}: the job was "
                f"asked to stop ({signal_name(signal)}); the server saves a checkpoint.")

    def finish(self) -> None:
        """Ending (:func:`.transitions.end`): leave, wait for the servers to
        close, the final exchange with each, the windows freed, the final
        weights and optimizer state."""
        end(self.rt, self.comms, self)

    # --- this side's part in end() ---
    def begin(self) -> None:
        self.finished = True
        self.lifecycle.end()

    def leave(self) -> None:
        channels = self.worker.channels
        for channel in channels:
            channel.leave()
        for channel in channels:  # a signal while it waits (or since its last step) stops the others
            channel.wait_closed(lambda: self.lifecycle.signal is not None and not self._told_servers)

    def dropped(self) -> List[int]:
        return sorted({m for channel in self.worker.channels for m in channel.dropped_workers()})

    def combine(self, workers: Any) -> None:
        combine_untrained_state(self.rt.mpi, workers, self.untrained_tensors)

    def final_tensors(self, shard: int) -> Tuple[List[torch.Tensor], torch.Tensor, Optional[Dict[str, Any]]]:
        start, stop = self.worker.slices[shard]
        return list(self.untrained_state.values()), self.worker.weights[start:stop], None

    def exchanged(self, shard: int, optimizer_state: Dict[str, Any]) -> None:
        self._states.append(optimizer_state)

    def free(self, shard: int) -> None:
        self.worker.channels[shard].free()

    def whole_model(self) -> Optional[torch.Tensor]:
        return self.split.whole_model(self.worker.weights)

    def took_whole_model(self, weights: torch.Tensor) -> None:
        """Nothing: the weights are this worker's own (every worker put the same slices together)."""

    def close(self, dropped: List[int], comms: List[Any]) -> None:
        rt = self.rt
        self.worker.load_weights()
        if not dropped:
            self.worker.optimizer.load_state_dict(self.split.whole_state(self._states))
        self.lifecycle.finish(at_exit=(lambda: end_without_dropped(rt, comms[0], "")) if dropped else None)


class HorovodSession:
    """Horovod's synchronous baseline on a worker: the workers allreduce among
    themselves; finishing only releases the idle server rank."""

    server_holds_weights = False

    def __init__(self, rt: Runtime):
        self.rt = rt
        rt.lifecycle.start_training(stops_on_signal=False)  # Horovod's own optimizer steps: signals stay as they were

    def restore_on_server(self, items: List[Tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: the server rank holds no model."""

    def register_untrained_state(self, tensors: List[torch.Tensor]) -> None:
        """Nothing to do: Horovod's workers keep their own buffers."""

    def finish(self) -> None:
        self.rt.lifecycle.end()
        self.rt.world.Ibarrier().Wait()
        self.rt.lifecycle.finish()


def idle_server(rt: Runtime) -> None:
    """The server rank in Horovod's baseline: nothing to serve.  Wait, sleeping
    rather than spinning so the workers keep the CPU, until every worker has
    finished, then exit with status 0."""
    finished = rt.world.Ibarrier()
    while not finished.Test():
        time.sleep(0.05)
    sys.exit(0)
