"""Gradient compression on the wire, with Horovod's names.

A compressor only picks the dtype a gradient travels in; the server always
compensates and steps in the model's own precision.  Weights travel back
uncompressed: each worker must hold exactly the weights the server recorded
as its backup w_bak(m).
"""

from __future__ import annotations

from typing import Optional

import torch


class Compressor:
    """No compression: gradients travel in the model's dtype."""

    wire_dtype: Optional[torch.dtype] = None

    @classmethod
    def wire(cls, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype a gradient of ``model_dtype`` travels in."""
        return cls.wire_dtype or model_dtype


class NoneCompressor(Compressor):
    pass


class FP16Compressor(Compressor):
    """Half precision: half the bytes of a float32 gradient."""

    wire_dtype = torch.float16


class BF16Compressor(Compressor):
    """bfloat16: half the bytes, float32's range."""

    wire_dtype = torch.bfloat16


class Compression:
    """Horovod-style namespace: ``Compression.none``, ``.fp16``, ``.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
