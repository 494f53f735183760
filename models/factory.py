"""Build the engine the settings name; heavy backends are imported only when chosen."""

from __future__ import annotations

from models.engine import Engine
from paperlane.settings import EngineKind, EngineSettings


def build_engine(cfg: EngineSettings) -> Engine:
    """A new, not yet started engine of the kind ``cfg`` names."""
    if cfg.kind is EngineKind.RAPID:
        from models.rapid import RapidEngine

        return RapidEngine(max_side=cfg.rapid_max_side)
    if cfg.kind is EngineKind.VLLM:
        from models.vllm_server import VllmServerEngine

        return VllmServerEngine(cfg)
    raise NotImplementedError(f"engine kind {cfg.kind.value} is not built yet")
