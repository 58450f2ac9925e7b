"""The C kernels -- the server's compensation and the worker's pack --
compiled on first use with the system's C compiler and loaded with ctypes: one
pass over memory, vectorised and spread over the cores with OpenMP, where a
chain of torch ops makes one pass per op.

The library is cached (``HVD_DCASGD_CACHE``, default ``~/.cache/hvd_dcasgd``)
under a name derived from its source, the flags, the machine and the compiler,
so it is built once per machine.  With no compiler (one warning line), or with
``HVD_DCASGD_NATIVE=0``, :func:`dcasgd_f32` returns False (:func:`pack_f32`
None) and the caller uses its torch implementation.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from ..common.config import resolve, setting
from ..common.log import get_logger

log = get_logger("native")

SOURCE = Path(__file__).with_name("dcasgd_kernel.c")
FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", "-fPIC", "-shared"]
#: The vector instructions of the CPU it runs on (AVX2/AVX-512 halve the
#: adaptive kernel's time against x86-64's baseline SSE2).  Exact either way:
#: IEEE square roots and divisions round alike at every width, and
#: -ffp-contract=off keeps FMA out.  A compiler that refuses it builds without.
NATIVE = ["-march=native"]

_library: Optional[ctypes.CDLL] = None
_tried = False


def _cache_dir() -> Path:
    if setting("HVD_DCASGD_CACHE"):
        return Path(setting("HVD_DCASGD_CACHE"))
    try:
        return Path.home() / ".cache" / "hvd_dcasgd"
    except RuntimeError:  # no home directory
        return Path(tempfile.gettempdir()) / "hvd_dcasgd"


def _cpu() -> bytes:
    """What identifies this CPU's instruction set: its model and feature
    flags, so that a cache shared by nodes of different CPUs (a home
    directory on a cluster) holds one library for each."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode()
    keep = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in keep})).encode()


def _build() -> Optional[ctypes.CDLL]:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc) found")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS + NATIVE).encode(), platform.machine().encode(),
                      version.encode(), _cpu()])
    cache = _cache_dir()
    target = cache / f"dcasgd_kernel_{hashlib.sha256(key).hexdigest()[:16]}.so"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as scratch:  # ranks may build at once
            built = Path(scratch) / target.name
            for flags in (FLAGS + NATIVE, FLAGS):
                result = subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built), "-lm"],
                                        capture_output=True, timeout=120)
                if result.returncode == 0:
                    break
            result.check_returncode()
            os.replace(built, target)
    library = ctypes.CDLL(str(target))
    library.hvd_dcasgd_f32.restype = None
    library.hvd_dcasgd_f32.argtypes = (
        [ctypes.c_void_p] * 5 + [ctypes.c_int64] + [ctypes.c_float] * 10 + [ctypes.c_int] * 3
    )
    library.hvd_pack_f32.restype = ctypes.c_int
    library.hvd_pack_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    return library


def library() -> Optional[ctypes.CDLL]:
    """The loaded kernel library, or None where it cannot be built."""
    global _library, _tried
    if not _tried:
        _tried = True
        if resolve("HVD_DCASGD_NATIVE") != "0":
            try:
                _library = _build()
            except (OSError, AttributeError, subprocess.SubprocessError) as exc:
                log.warning(f"hvd_dcasgd: the C compensation kernel is unavailable ({exc}); using torch ops, which are "
                            "slower")
    return _library


def _suitable(t: Optional[torch.Tensor]) -> bool:
    return t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous())


def dcasgd_f32(grad: torch.Tensor, weight: torch.Tensor, backup: torch.Tensor, mean_square: Optional[torch.Tensor],
               lambda_0: float, mean_square_momentum: float, eps: float, lr: Optional[float],
               weight_decay: float = 0.0, momentum: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
               momentum_buffer: Optional[torch.Tensor] = None, first_step: bool = False,
               bound: float = math.inf) -> bool:
    """Run the kernel in place if it is available and the tensors are
    contiguous float32 on the CPU; return whether it ran.  ``bound`` limits
    the correction to ``bound * |g|`` (infinite: the paper's formula).  With
    ``lr``, the step is torch.optim.SGD's with these hyperparameters
    (``momentum_buffer`` when momentum is on; ``first_step`` starts it from
    the gradient)."""
    tensors = (grad, weight, backup, mean_square, momentum_buffer)
    lib = library()
    if lib is None or not all(_suitable(t) for t in tensors):
        return False
    pointer = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    lib.hvd_dcasgd_f32(
        *map(pointer, tensors), weight.numel(),
        lambda_0, mean_square_momentum, 1 - mean_square_momentum, eps, bound,
        0.0 if lr is None else lr, weight_decay, momentum,
        0.0 if first_step else momentum, 1.0 if first_step else 1 - dampening,  # carry, undamped
        torch.get_num_threads(), int(nesterov), int(lr is not None),
    )
    return True


def dcasgd_f32_streams(grad: torch.Tensor, weight: torch.Tensor, backup: torch.Tensor,
                       mean_square: Optional[torch.Tensor], lambda_0: float, mean_square_momentum: float, eps: float,
                       lr: Optional[float], weight_decay: float = 0.0, momentum: float = 0.0,
                       dampening: float = 0.0, nesterov: bool = False,
                       momentum_buffer: Optional[torch.Tensor] = None, first_step: bool = False,
                       bound: float = math.inf) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """The arrays one pass of :func:`dcasgd_f32` with these arguments reads
    and writes, as the kernel's variant (chosen as ``hvd_dcasgd_f32`` does)
    touches them: the gradient and the weights are read; the backup is read
    unless a step's compensation is plain (lambda_0 0, no MeanSquare); MeanSquare
    and the momentum buffer are read and written where given; with a step
    the weights and the backup are written, without one the gradient."""
    step = lr is not None
    plain = step and mean_square is None and lambda_0 == 0.0  # only the step variants have a plain form
    reads = [grad, weight] + ([] if plain else [backup])
    writes = [weight, backup] if step else [grad]
    extra = [mean_square] + ([momentum_buffer] if step else [])
    for t in extra:
        if t is not None:
            reads.append(t)
            writes.append(t)
    return reads, writes


def pack_f32(src: torch.Tensor, dst: torch.Tensor, check: bool = True) -> Optional[bool]:
    """Copy ``src`` into ``dst`` in one pass and, with ``check``, return
    whether every element is finite (True without it); None, having done
    nothing, unless the kernel is available and both are contiguous float32
    tensors of one size on the CPU."""
    lib = library()
    if lib is None or src.numel() != dst.numel() or not all(
            t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in (src, dst)):
        return None
    return not lib.hvd_pack_f32(src.data_ptr(), dst.data_ptr(), src.numel(), int(check), torch.get_num_threads())
