"""``DistributedOptimizer``: the user's optimizer, made asynchronous -- its
options checked, then what each role does with it.

On a worker it returns the wrapped optimizer (:mod:`.wrapped`), whose
``step()`` pushes the gradients to the parameter server and loads the weights
it answers with; the server runs the user's optimizer on the compensated
gradient.  On the server rank, building the optimizer *is* running the
server: it serves until every worker has finished, then exits with status 0.
The ``horovod`` method is the baseline: Horovod's own synchronous
``DistributedOptimizer`` among the workers, the server rank idle.  Which
method and constants: :mod:`.method`.
"""

from __future__ import annotations

from typing import Iterable, Optional, Tuple, Type

import torch

from ..algorithm.compensation import Compensation
from ..algorithm.shards import check_shardable, is_elementwise, partition
from ..algorithm.update import lr_factor
from ..common.config import resolve
from ..common.errors import HvdDcasgdError, HvdDcasgdValueError
from ..protocol.layout import ModelLayout
from ..runtime.exits import raise_together, rendezvous
from ..runtime.horovod import require_horovod
from ..runtime.roles import LOCAL, SERVER, WORKER, Runtime, runtime
from ..serving.session import HorovodSession, idle_server, run_server, start_worker
from .compression import Compression, Compressor
from .method import BACKENDS, METHODS, constants, method_name, resolve_method
from .mpi_ops import Adasum, Average, Sum
from .wrapped import wrap

__all__ = ["BACKENDS", "METHODS", "DistributedOptimizer"]


def _server_device(rt: Runtime, requested: Optional[str]) -> torch.device:
    """The server's device: as asked, else its GPU when it has one, else the
    CPU.  Its GPU (also for a bare ``cuda``) is the one at its index among
    the servers of its node, ``hvd.local_rank()``, where ``init()`` put it
    (docs/GPU.md); modulo the GPUs it sees, where it sees fewer."""
    requested = resolve("HVD_DCASGD_SERVER_DEVICE", requested)
    device = torch.device(requested) if requested else None
    if device is not None and (device.type != "cuda" or device.index is not None):
        return device
    if not torch.cuda.is_available():
        return device or torch.device("cpu")
    return torch.device("cuda", rt.local_rank % torch.cuda.device_count())


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
    compression: Type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: str = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups=None,
    sparse_as_dense: bool = False,
    process_set=None,
    *,
    compensation: Optional[str] = None,
    lambda_0: Optional[float] = None,
    mean_square_momentum: Optional[float] = None,
    eps: Optional[float] = None,
    per_worker_mean_square: bool = False,
    bound: Optional[float] = None,
    gamma: Optional[float] = None,
    gap_eps: Optional[float] = None,
    model: Optional[torch.nn.Module] = None,
    trace: Optional[str] = None,
    server_device: Optional[str] = None,
    check_finite: bool = True,
    schedule: Optional[str] = None,
    backend: Optional[str] = None,
    lr_scaling: Optional[str] = None,
    checkpoint_dir: Optional[str] = None,
    metrics_dir: Optional[str] = None,
    fusion_threshold: Optional[int] = None,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` for asynchronous training with delay compensation.

    On a worker, ``step()`` pushes the gradients to the parameter server and
    loads the weights it answers with; on the server rank this call serves
    until every worker has finished, then exits with status 0.

    Arguments:
        optimizer: the optimizer the server runs (any ``torch.optim``
            optimizer; ``torch.optim.SGD`` takes the one-pass C kernel).
        named_parameters: the model's ``named_parameters()``, so that a
            mismatch between ranks is reported by name.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16``: the dtype
            gradients travel in.
        backward_passes_per_step: backward passes accumulated locally per step.
        op: must be ``Average``.  ``gradient_predivide_factor``,
            ``num_groups``, ``groups``, ``sparse_as_dense`` and ``process_set``
            are Horovod's; they are accepted and have no effect here (one flat
            dense message carries every gradient), and are passed on under the
            ``horovod`` backend.
        compensation: ``"adaptive"`` (DC-ASGD-a, default), ``"constant"``
            (DC-ASGD-c), ``"none"`` (ASGD) or any registered compensation; the
            shorthands ``"sync"`` (``none`` on the ``sync`` schedule: SSGD on
            the server) and ``"horovod"`` (the ``horovod`` backend).
            ``HVD_DCASGD_COMPENSATION`` overrides it.
        lambda_0: DC-ASGD's lambda_0 (``constant``: 0.04, ``adaptive``:
            8.0 by default).  ``HVD_DCASGD_LAMBDA`` overrides it.
        bound: DC-ASGD's bound on its correction, element by element, as a
            multiple of the gradient (default 1.0: never larger than the
            gradient, so it never reverses it); ``math.inf`` is the paper's
            unbounded rule.  ``HVD_DCASGD_BOUND`` overrides it.
        mean_square_momentum, eps: DC-ASGD-a's MeanSquare momentum (0.95)
            and epsilon (1e-7).  ``HVD_DCASGD_MEAN_SQUARE_MOMENTUM`` and
            ``HVD_DCASGD_EPS`` override them.
        per_worker_mean_square: one MeanSquare per worker (the authors' code)
            instead of the paper's global one.
        gamma, gap_eps: Gap-Aware's momentum of its running average of g * g
            (0.999) and its epsilon (1e-8).  ``HVD_DCASGD_GAMMA`` and
            ``HVD_DCASGD_GAP_EPS`` override them.

        Each constant left unset takes its compensation's default; one the
        chosen compensation does not use (``gamma`` with ``adaptive``, say)
        is an error naming those it uses.
        model: lets the server manage the rest of the model's state (buffers
            such as BatchNorm statistics, frozen parameters).
        trace: a path for the server's JSON-lines trace (``HVD_DCASGD_TRACE``).
        server_device: the server's device, CUDA when it has one by default
            (``HVD_DCASGD_SERVER_DEVICE``).
        check_finite: refuse a NaN or Inf gradient on the worker, before it is sent.
        schedule: ``"async"`` (default: each push applied as it arrives) or
            ``"sync"`` (one averaged update per round of pushes).
            ``HVD_DCASGD_SCHEDULE`` overrides it.
        backend: ``"server"`` (default: the parameter server) or ``"horovod"``
            (Horovod's own ``DistributedOptimizer`` among the workers, the
            server rank idle).  ``HVD_DCASGD_BACKEND`` overrides it.
        lr_scaling: ``"horovod"`` (default): the optimizer's learning rate
            means what it means under Horovod, the rate for the average of
            ``size()`` gradients (scripts scale it by ``hvd.size()``), so each
            asynchronous gradient is applied at ``lr / size()``; the ``sync``
            schedule applies it as given.  ``"none"``: every gradient at the
            rate as given (scripts written for asynchronous SGD, the paper's
            setting).  ``HVD_DCASGD_LR_SCALING`` overrides it.
        checkpoint_dir: a folder where the server writes checkpoints of the
            whole training state (every ``HVD_DCASGD_CHECKPOINT_INTERVAL``
            seconds, when the job is asked to stop, and at the end; the last
            two kept); a job started again with the same folder resumes from
            the newest, each worker from the weights it last received, and
            ``optimizer.pushes`` says how many steps to skip.  It may resume
            with another number of workers: the ones that left leave nothing
            pending, new ones start from the current weights
            (docs/RELIABILITY.md, "Another number of workers").
            ``HVD_DCASGD_CHECKPOINT_DIR`` overrides it.
        metrics_dir: a folder where the server writes its scalars for
            TensorBoard (rates, staleness, each worker's pushes per second,
            ...: :mod:`hvd_dcasgd.observability.metrics`) every
            ``HVD_DCASGD_METRICS_INTERVAL`` seconds.
            ``HVD_DCASGD_METRICS`` overrides it.
        fusion_threshold: the most bytes of gradient a worker sends in one
            bucket during backward, as soon as backward has finished it
            (default 64 MiB, Horovod's ``HOROVOD_FUSION_THRESHOLD``); 0
            sends the whole gradient with ``step()``.  The server applies
            the push whole either way.  ``HVD_DCASGD_FUSION_THRESHOLD``
            overrides it.
    """
    rt = runtime()
    if rt.session is not None:
        raise HvdDcasgdError("hvd_dcasgd: one DistributedOptimizer per process is supported")
    # Every rank checks the options; a problem any rank finds is said once and ends every rank alike.
    problem = None
    try:
        compensation, schedule, backend = resolve_method(compensation, schedule, backend)
        if backend != "horovod":
            threshold, lr_scaling, settings = _server_options(
                compensation, schedule, op, backward_passes_per_step, fusion_threshold, lr_scaling,
                per_worker_mean_square, lambda_0=lambda_0, bound=bound, mean_square_momentum=mean_square_momentum,
                eps=eps, gamma=gamma, gap_eps=gap_eps)
    except HvdDcasgdError as exc:
        if rt.role == LOCAL:
            raise
        problem = exc
    if rt.role != LOCAL:
        if not rt.joined:
            rendezvous(rt.world, rt.mpi, rt.servers)  # a rank that exited instead is named, never waited for
            rt.joined = True
        raise_together(rt.world, problem)
    method = method_name(compensation, schedule, backend)
    _agree_on_method(rt, method)
    if backend == "horovod":
        return _horovod_optimizer(
            rt, optimizer, named_parameters, compression, backward_passes_per_step, op,
            gradient_predivide_factor, num_groups, groups, sparse_as_dense, process_set,
        )
    layout = ModelLayout.of(optimizer, named_parameters, model)
    wire_dtype = compression.wire(layout.dtype)
    slices = _slices(rt, optimizer, layout)
    if rt.role == SERVER:
        trace = resolve("HVD_DCASGD_TRACE", trace)
        run_server(rt, optimizer, layout, settings, wire_dtype, model, _server_device(rt, server_device), trace,
                   checkpoint_dir, slices, metrics_dir, lr_scaling=lr_scaling)
    wrapped = wrap(optimizer, backward_passes_per_step)
    wrapped.compensation = settings
    wrapped.lr_scaling = lr_scaling
    wrapped.method = method
    if rt.role != LOCAL:
        wrapped._session = start_worker(rt, wrapped, layout, settings, wire_dtype, model, check_finite, slices,
                                        lr_scaling=lr_scaling)
        wrapped._session.worker.set_fusion_threshold(threshold)
    return wrapped


def _server_options(compensation: str, schedule: str, op: str, backward_passes_per_step: int,
                    fusion_threshold: Optional[int], lr_scaling: Optional[str], per_worker_mean_square: bool,
                    **constant_arguments: Optional[float]) -> Tuple[int, str, Compensation]:
    """The parameter server's options, checked: (fusion threshold, learning
    rate scaling, the compensation's settings), or a sentence raised."""
    if op != Average:
        raise HvdDcasgdError(
            f"hvd_dcasgd: op={op!r} is not supported: the parameter server applies each worker's gradient "
            "(or, in sync mode, their average)"
        )
    if backward_passes_per_step < 1:
        raise HvdDcasgdError("hvd_dcasgd: backward_passes_per_step must be at least 1")
    threshold = resolve("HVD_DCASGD_FUSION_THRESHOLD", fusion_threshold)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise HvdDcasgdValueError(f"hvd_dcasgd: fusion_threshold={threshold!r} is not valid: use a whole number "
                                  "of bytes >= 0.")
    lr_scaling = resolve("HVD_DCASGD_LR_SCALING", lr_scaling)
    lr_factor(lr_scaling, schedule, 1)  # an unknown one is a sentence here
    settings = Compensation(mode=compensation, schedule=schedule, per_worker_mean_square=per_worker_mean_square,
                            **constants(**constant_arguments))
    return threshold, lr_scaling, settings


def _slices(rt: Runtime, optimizer: torch.optim.Optimizer, layout: ModelLayout) -> list:
    """Each server's slice of the flat parameter vector, the same on every
    rank (split inside a parameter only for an element-wise optimizer); what
    several servers cannot do yet is refused on every rank alike."""
    try:
        check_shardable(optimizer, rt.servers)
        return partition(layout.offsets, rt.servers, whole_tensors=not is_elementwise(optimizer))
    except HvdDcasgdValueError as exc:  # the same on every rank
        raise HvdDcasgdValueError(str(exc), collective=True, speaks=_speaks(rt)) from None


def _speaks(rt: Runtime) -> bool:
    """Whether this rank says a sentence every rank raises together (the first rank does, for all)."""
    return rt.world is None or rt.world.Get_rank() == 0


def _agree_on_method(rt: Runtime, method: str) -> None:
    """Every rank must run the same method, and Horovod's baseline needs
    Horovod on every worker: otherwise the same clear error on every rank."""
    if rt.role == LOCAL:
        if method == "horovod":
            require_horovod(rt.horovod, 'compensation="horovod"', rt.horovod_off)
        return
    answers = rt.world.allgather((method, rt.horovod_off if rt.role == WORKER else None))
    methods = sorted({m for m, _ in answers})
    if "horovod" in methods and len(methods) > 1:  # other mismatches: the session's agreement check names them
        raise HvdDcasgdError(
            f"hvd_dcasgd: the ranks were asked for different methods ({', '.join(methods)}); "
            "set the same compensation (or HVD_DCASGD_COMPENSATION) on every rank.",
            collective=True, speaks=_speaks(rt),
        )
    not_running = [reason for _, reason in answers if reason]
    if method == "horovod" and not_running:
        require_horovod(None, 'compensation="horovod" on every worker', not_running[0])


_HOROVOD_OPS = {Average: "Average", Sum: "Sum", Adasum: "Adasum"}


def _horovod_optimizer(
    rt: Runtime,
    optimizer: torch.optim.Optimizer,
    named_parameters,
    compression: Type[Compressor],
    backward_passes_per_step: int,
    op: str,
    gradient_predivide_factor: float,
    num_groups: int,
    groups,
    sparse_as_dense: bool,
    process_set,
) -> torch.optim.Optimizer:
    """Horovod's ``DistributedOptimizer`` among the workers; on the server
    rank, idle until the workers finish, then exit with status 0."""
    if rt.role == SERVER:
        idle_server(rt)
    horovod = rt.horovod
    name = next((n for n in ("none", "fp16", "bf16") if getattr(Compression, n) is compression), None)
    if name is None or not hasattr(horovod.Compression, name) or op not in _HOROVOD_OPS:
        raise HvdDcasgdError(f"hvd_dcasgd: Horovod has no {name or compression.__name__} compression or {op!r} op")
    options = {} if process_set is None else {"process_set": process_set}
    wrapped = horovod.DistributedOptimizer(
        optimizer,
        named_parameters=named_parameters,
        compression=getattr(horovod.Compression, name),
        backward_passes_per_step=backward_passes_per_step,
        op=getattr(horovod, _HOROVOD_OPS[op]),
        gradient_predivide_factor=gradient_predivide_factor,
        num_groups=num_groups,
        groups=groups,
        sparse_as_dense=sparse_as_dense,
        **options,
    )
    wrapped.method = "horovod"
    if rt.role == WORKER:
        rt.session = HorovodSession(rt)
    return wrapped
