"""The foundation every other subpackage stands on: the package's errors and
warnings (`errors`), the one table of ``HVD_DCASGD_*`` settings (`config`),
its loggers (`log`), atomic file writes and folder locks (`files`), running a
command in its own process group (`process`), small tensor helpers
(`tensors`), every MPI message tag (`tags`), and the one-pass C kernels
(`native`, ``dcasgd_kernel.c``: the server's compensation and step, the
worker's pack), compiled on first use.

May import: the standard library, torch, numpy; nothing else of this package.
"""
