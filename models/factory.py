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
    if cfg.kind is EngineKind.VLLM_INPROCESS:
        from models.vllm_inprocess import VllmInprocessEngine

        return VllmInprocessEngine(cfg)
    from models.transformers_backend import TransformersEngine

    return TransformersEngine(cfg)
