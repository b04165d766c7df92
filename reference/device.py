"""Where the model runs. `device="auto"` picks CUDA when this torch sees a GPU, else the CPU.

The model, its K/V cache and the engine's block pool live on that device. Tokens are chosen on
the CPU: sampling draws from each request's own `torch.Generator`, which lives there, so one row
of logits per token crosses back (192 KiB for SmolLM2's vocabulary) and a seeded request samples
the same tokens on any device.
"""
from __future__ import annotations

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")   # what the command lines offer ("cuda:N" also works here)


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """"auto" or None -> cuda when available, else cpu; "cpu", "cuda", "cuda:N" or a torch.device
    -> that device, checked. Raises ValueError with a one-line reason for anything else."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if resolved.type == "cpu":
        return torch.device("cpu")
    if resolved.type != "cuda":
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was asked for, but this torch ({torch.__version__}) "
                         "sees no CUDA GPU: use device='cpu' (or 'auto')")
    if resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ValueError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} "
                         "CUDA device(s)")
    return resolved


def device_of(model) -> torch.device:
    """Where a model's parameters live: `model.device` when it has one, else its first
    parameter's device, else the CPU (a toy model of chapter 10 has no parameters)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    parameters = getattr(model, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return first.device if first is not None else torch.device("cpu")
