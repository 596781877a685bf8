"""Importing this package registers every strategy (stock, gather_cast, shadow, native_fp8, fused_fp8, ...)."""

from harness.strategies import fused_fp8, gather_cast, native_fp8, shadow, stock  # noqa: F401
from harness.strategies.base import REGISTRY, Strategy

ORDER = ("stock", "stock_vectorized", "gather_cast", "shadow", "native_fp8", "fused_fp8")

__all__ = ["REGISTRY", "ORDER", "Strategy"]
