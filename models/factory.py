"""Build the engine the settings name; heavy backends are imported only when chosen."""

from __future__ import annotations

from paperlane.models.engine import Engine
from paperlane.settings import EngineKind, EngineSettings


def build_engine(cfg: EngineSettings) -> Engine:
    """A new, not yet started engine of the kind ``cfg`` names."""
    if cfg.kind is EngineKind.RAPID:
        from paperlane.models.rapid import RapidEngine

        return RapidEngine(max_side=cfg.rapid_max_side, min_confidence=cfg.min_confidence,
                           layout_model=cfg.layout_model)
    if cfg.kind is EngineKind.VLLM:
        from paperlane.models.vllm_server import VllmServerEngine

        return VllmServerEngine(cfg)
    if cfg.kind is EngineKind.VLLM_INPROCESS:
        from paperlane.models.vllm_inprocess import VllmInprocessEngine

        return VllmInprocessEngine(cfg)
    from paperlane.models.transformers_backend import TransformersEngine

    return TransformersEngine(cfg)
