"""A pure-PyTorch stand-in for the parts of ``flash_attn`` that task packages call.

Put ``agent/worker/compat`` on ``sys.path`` to make ``import flash_attn`` resolve here when
the real package is not installed.  ``STANDIN`` lets callers label results that
came from this module rather than from FlashAttention's CUDA kernels.
"""

from optagent.worker.compat.flash_attn.flash_attn_interface import flash_attn_with_kvcache

STANDIN = True
__version__ = "0.0.0+optagent-standin"

__all__ = ["STANDIN", "__version__", "flash_attn_with_kvcache"]
