"""vLLM test tier: work around two vLLM bugs in every process of the tier (tests, server, engine workers).

Bug 1: on CPU, ``vllm._custom_ops.onednn_mm`` (oneDNN GEMM behind the linear layers) fails with
``Expected a.stride(-1) == 1`` when handed a non-contiguous input. HunYuanVL's vision patch merger passes a
permuted tensor to a linear layer, so every image request dies in the engine. GPUs are unaffected.

Fix: make the input contiguous before calling the real kernel.

Bug 2 (vLLM 0.32 Transformers modeling backend, not CPU-specific): when several images are encoded in one
step, ``MultiModalMixin._process_vision_input`` splits the concatenated encoder output by the number of
*patches* per image (``num_image_patches``) while HunYuanVL's encoder returns fewer, merged tokens
(h/2*(w/2+1)+2 per image); the mismatch is "fixed" by repeating/truncating, so every image but the first of a
batch gets another image's features (log: "Encoder returned a different number of tokens than expected"), and
the wrong result is then reused by vLLM's caches for later requests with the same image. Single requests match
transformers exactly. Fix: encode the items of a batch one at a time (same results as transformers).

And one switch that is no fix: ``PAPERLANE_VLLM_STEP_SECONDS`` paces the engine's steps (``_pace_engine_core``).

This module is found as ``sitecustomize`` because the tier puts ``tests/vllm_tier`` on PYTHONPATH; processes
spawned by the engine inherit PYTHONPATH and therefore the fixes. At interpreter start it only inserts a tiny
finder into ``sys.meta_path`` (no import of vllm or torch); each patch is applied right after its module
(``vllm._custom_ops``, ``vllm.model_executor.models.transformers.multimodal``) is executed, i.e. before any
other module can bind the original function. If vLLM is not installed, nothing happens. Set
``PAPERLANE_VLLM_NO_PATCH=1`` to disable both.

A ``sitecustomize`` module that ours shadows (e.g. Debian's) is still executed. ``install()`` applies the
workaround explicitly (idempotent) where PYTHONPATH could not be set before the interpreter started.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


def _patch_custom_ops(module) -> None:
    original = getattr(module, "onednn_mm", None)
    if original is None or getattr(original, "_paperlane_contiguous", False):
        return

    def onednn_mm(*args, **kwargs):
        # Signature in vLLM: onednn_mm(dnnl_handler, x, bias). Make every tensor argument's last dimension
        # contiguous (only the activations can be non-contiguous; .contiguous() is a no-op otherwise).
        args = tuple(_contiguous(a) for a in args)
        kwargs = {k: _contiguous(v) for k, v in kwargs.items()}
        return original(*args, **kwargs)

    onednn_mm.__doc__ = original.__doc__
    onednn_mm.__wrapped__ = original  # type: ignore[attr-defined]
    onednn_mm._paperlane_contiguous = True  # type: ignore[attr-defined]
    module.onednn_mm = onednn_mm


def _contiguous(value):
    is_contiguous = getattr(value, "is_contiguous", None)
    if is_contiguous is not None and getattr(value, "dim", None) is not None:
        try:
            if value.dim() > 0 and not is_contiguous():
                return value.contiguous()
        except Exception:  # noqa: BLE001 - never let the workaround itself fail a request
            return value
    return value


def _patch_transformers_multimodal(module) -> None:
    mixin = getattr(module, "MultiModalMixin", None)
    original = getattr(mixin, "_process_vision_input", None)
    if original is None or getattr(original, "_paperlane_per_item", False):
        return

    def _process_vision_input(self, modality, pixel_values, num_patches, **kwargs):
        import torch

        split_sizes = num_patches.flatten().tolist()
        if (
            isinstance(pixel_values, torch.Tensor)
            and len(split_sizes) > 1
            and pixel_values.shape[0] == sum(split_sizes)
        ):
            # Encode the items of the batch one by one (rows of pixel_values = patches of each item).
            embeddings = []
            offset = 0
            for index, size in enumerate(split_sizes):
                features = self._get_features(
                    modality,
                    pixel_values[offset : offset + size],
                    **self._select_item_kwargs(kwargs, index, len(split_sizes)),
                )
                offset += size
                if not isinstance(features, torch.Tensor):
                    features = torch.cat(list(features))
                embeddings.extend(self._split_embeddings(features, [size]))
            return embeddings
        return original(self, modality, pixel_values, num_patches, **kwargs)

    _process_vision_input.__doc__ = original.__doc__
    _process_vision_input.__wrapped__ = original  # type: ignore[attr-defined]
    _process_vision_input._paperlane_per_item = True  # type: ignore[attr-defined]
    mixin._process_vision_input = _process_vision_input


def _pace_engine_core(module) -> None:
    """Not a bug fix: ``PAPERLANE_VLLM_STEP_SECONDS`` makes every engine step last at least that long (a test
    server paced like a slower accelerator; see conftest's ``paced_vllm_server``)."""
    seconds = float(os.environ.get("PAPERLANE_VLLM_STEP_SECONDS") or 0)
    core = getattr(module, "EngineCore", None)
    original = getattr(core, "step", None)
    if seconds <= 0 or original is None or getattr(original, "_paperlane_paced", False):
        return
    import time

    def step(self, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        finally:
            time.sleep(max(0.0, seconds - (time.monotonic() - t0)))

    step.__doc__ = original.__doc__
    step.__wrapped__ = original  # type: ignore[attr-defined]
    step._paperlane_paced = True  # type: ignore[attr-defined]
    core.step = step


# module name -> patch applied right after the module has been executed
_PATCHES = {
    "vllm.v1.engine.core": _pace_engine_core,
    "vllm._custom_ops": _patch_custom_ops,
    "vllm.model_executor.models.transformers.multimodal": _patch_transformers_multimodal,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, wrapped: importlib.abc.Loader, patch) -> None:
        self._wrapped = wrapped
        self._patch = patch

    def __getattr__(self, name):  # get_source, get_code, get_filename, is_package, ... (inspect, linecache)
        if name == "_wrapped":  # not initialised (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._wrapped, name)

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module) -> None:
        self._wrapped.exec_module(module)
        try:
            self._patch(module)
        except Exception as exc:  # noqa: BLE001 - a failed patch must not break the import
            print(f"[paperlane vllm tier] patch of {module.__name__} not applied: {exc!r}", file=sys.stderr)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; for the modules in _PATCHES it wraps the real loader to patch after execution."""

    def find_spec(self, fullname, path=None, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


def _install() -> None:
    if os.environ.get("PAPERLANE_VLLM_NO_PATCH"):
        return
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:  # already imported (install() called late): patch in place
            patch(module)
    if not any(isinstance(f, _PatchingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchingFinder())


def _run_shadowed_sitecustomize() -> None:
    """Execute the next ``sitecustomize`` on sys.path (the one this module hides), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        try:
            if os.path.abspath(entry or os.getcwd()) == here:
                continue
            candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
            if not os.path.isfile(candidate):
                continue
        except Exception:  # noqa: BLE001, S112 - odd sys.path entries are skipped
            continue
        spec = importlib.util.spec_from_file_location("_paperlane_shadowed_sitecustomize", candidate)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001
                print(
                    f"[paperlane vllm tier] shadowed sitecustomize {candidate} failed: {exc!r}",
                    file=sys.stderr,
                )
        return


def install() -> None:
    """Public entry point: apply the workaround in this process (idempotent); for code that cannot rely on
    PYTHONPATH (``import``-ing this file under another name calls it too)."""
    _install()


_install()
if __name__ == "sitecustomize":  # loaded by site.py at start-up: keep the shadowed one's behaviour
    _run_shadowed_sitecustomize()
