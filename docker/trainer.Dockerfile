# syntax=docker/dockerfile:1
# The trainer image: `torchrun -m pipeline.train` on GPUs (the Kubeflow TrainJob / PyTorchJob container), on the
# official PyTorch CUDA image of the pinned torch. cuda_ext is built with its CUDA kernels for A100 (sm_80)
# and H100/H200 (sm_90), plus compute_90 PTX for newer GPUs. Build from the repository root:
#   docker build -f docker/trainer.Dockerfile -t pretrain-trainer:0.1.0 .
# torch 2.13.0's Linux wheels are CUDA 13.0 / cuDNN 9 builds (its PyPI metadata), hence the base image tag.
ARG TORCH_VERSION=2.13.0
ARG CUDA_VERSION=13.0

# Stage 1: nvcc (devel image) compiles the package wheel with the extension in it.
FROM pytorch/pytorch:${TORCH_VERSION}-cuda${CUDA_VERSION}-cudnn9-devel AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock ./
# Build requirements (pyproject.toml), at their locked versions; torch comes with the base image.
RUN grep -E '^(pybind11|setuptools|wheel)==' requirements.lock > build-requirements.txt \
    && pip install --no-cache-dir -r build-requirements.txt
COPY setup.cfg setup.py pyproject.toml README.md MANIFEST.in ./
COPY pipeline ./pipeline
COPY operators ./operators
COPY cuda_ext ./cuda_ext
# setup.py's switches: fail without nvcc instead of silently building CPU-only kernels, and the archs.
# TORCH_CUDA_ARCH_LIST says the same to anything built with torch.utils.cpp_extension.
ENV PRETRAIN_BUILD_CUDA=1 \
    PRETRAIN_CUDA_ARCHS="80;90" \
    TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX"
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# Stage 2: the runtime image (no compilers); the CUDA runtime is linked statically into cuda_ext._C.
FROM pytorch/pytorch:${TORCH_VERSION}-cuda${CUDA_VERSION}-cudnn9-runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /tmp/install
# The training, tracking and tokenizer extras at their locked versions (-c), before the wheel, so code changes
# reuse this layer. The lock's torch==2.13.0 is the base image's torch (2.13.0+cu130 satisfies it): pip keeps it.
# (No `pip check`: the base image's conda packages are not ours to fix.)
COPY requirements.lock setup.cfg docker/extras_requirements.py ./
RUN python extras_requirements.py setup.cfg train tracking tokenize > runtime-requirements.txt \
    && pip install --no-cache-dir -c requirements.lock -r runtime-requirements.txt
COPY --from=build /wheels ./wheels
RUN pip install --no-cache-dir --no-deps wheels/pretrain_pipeline-*.whl \
    && rm -rf wheels \
    && python -c "import cuda_ext._C as c; assert c.WITH_CUDA, 'cuda_ext was built without its CUDA kernels'"
RUN useradd --create-home --uid 10001 --user-group pretrain \
    && mkdir /data \
    && chown pretrain:pretrain /data
ENV PRETRAIN__PROJECT__DATA_ROOT=/data
WORKDIR /home/pretrain
USER 10001:10001
VOLUME ["/data"]
ENTRYPOINT ["torchrun"]
# The job gives the arguments, e.g. --nnodes=2 --nproc-per-node=8 -m pipeline.train --snapshot s1
CMD ["--help"]
