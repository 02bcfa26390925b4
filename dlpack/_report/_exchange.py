"""One exchange: a provider's array through ``asdlpack`` into a consumer, and what came of it."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ._consumers import Consumer
from ._libraries import Unavailable, cuda_devices, label, library, short_error
from ._providers import Provider, Sample

# ---------------------------------------------------------------------------
# one exchange
# ---------------------------------------------------------------------------


@dataclass
class Outcome:
    status: str  # "zero-copy", "copy", "fails" or "skip"
    reason: str = ""
    stage: str = ""  # where it failed: "provider", "asdlpack", "consumer" or "values"
    exc: BaseException | None = None
    sample: Sample | None = None
    values: Any = None
    src_ptr: int | None = None
    dst_ptr: int | None = None
    result: Any = None

    @property
    def works(self) -> bool:
        return self.status in ("zero-copy", "copy")


def exchange(provider: Provider, consumer: Consumer, device: str = "cpu") -> Outcome:
    """Make ``provider``'s sample on ``device``, wrap it with ``asdlpack``, give it to
    ``consumer``, and compare values and data pointers. Never raises (but KeyboardInterrupt)."""
    from dlpack import asdlpack

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in (provider.module, consumer.module):
            if name is not None:
                lib = library(name)
                if lib.status == "missing":
                    return Outcome("skip", lib.not_installed())
                if lib.status == "broken":
                    return Outcome("skip", f"{label(name)} fails to import: {lib.error}")
                if lib.status == "crashes":
                    return Outcome("skip", lib.error)
        if device == "cuda" and not cuda_devices()[0]:
            return Outcome("skip", "no CUDA device")
        stage = "provider"
        sample = None
        try:
            sample = provider.make(device)
            stage = "asdlpack"
            obj = asdlpack(sample.obj)
            stage = "consumer"
            result, values, ptr = consumer.consume(obj, device)
        except Unavailable as exc:
            return Outcome("skip", str(exc), stage=stage, sample=sample)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a failing library is reported
            reason = short_error(exc)
            if stage == "asdlpack":
                reason = f"asdlpack: {reason}"
            elif stage == "provider":
                reason = f"making the {provider.name} array: {reason}"
            return Outcome("fails", reason, stage=stage, exc=exc, sample=sample)
    out = Outcome(
        "copy", sample=sample, values=values, src_ptr=sample.ptr, dst_ptr=ptr, result=result
    )
    if not _same_values(values, sample.values):
        out.status, out.stage = "fails", "values"
        out.reason = f"wrong values: {_clip(values)} (expected {_clip(sample.values)})"
    elif sample.ptr is not None and ptr == sample.ptr:
        out.status = "zero-copy"
    return out


def _same_values(got: Any, expected: Any) -> bool:
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(_same_values(g, e) for g, e in zip(got, expected, strict=True))
        )
    try:
        return float(got) == float(expected)
    except (TypeError, ValueError):
        return False


def _clip(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
