"""What every benchmark script shares: the environment record and the atomic JSON write of its results."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import torch


def gpu_env(**extra: Any) -> dict[str, Any]:
    """GPU name and library versions, to store beside measured figures."""
    import triton

    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, python=platform.python_version(),
                date=time.strftime("%Y-%m-%d %H:%M:%S"), **extra)


def write_json(path: str | Path, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` through a temporary sibling, so a killed run never leaves half a file."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(out)
