# syntax=docker/dockerfile:1
# The Airflow image: the official apache/airflow image at the locked Airflow version, with this package, its
# providers and the DAGs. With the LocalExecutor the tasks run the stages in the scheduler's container, so
# the image carries every stage's dependencies (CPU torch) and Java for spark-submit. Build from the
# repository root:
#   docker build -f docker/airflow.Dockerfile -t pretrain-airflow:0.1.0 .
# "slim" is core Airflow only: every provider and library then comes from the lock, none from the image's
# own constraints.
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11

# Stage 1: compile the package wheel (cuda_ext's CPU kernels need g++).
FROM apache/airflow:slim-${AIRFLOW_VERSION}-python${PYTHON_VERSION} AS build
USER 0
# WORKDIR would create the folder as root; the airflow user writes build/ and egg-info/ there.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir /opt/airflow/src \
    && chown 50000:0 /opt/airflow/src
USER 50000:0
WORKDIR /opt/airflow/src
COPY --chown=airflow:0 requirements.lock ./
RUN grep -E '^(pybind11|setuptools)==' requirements.lock > build-requirements.txt \
    && pip install --no-cache-dir -r build-requirements.txt
COPY --chown=airflow:0 setup.cfg setup.py pyproject.toml README.md MANIFEST.in ./
COPY --chown=airflow:0 pipeline ./pipeline
COPY --chown=airflow:0 operators ./operators
COPY --chown=airflow:0 cuda_ext ./cuda_ext
RUN PRETRAIN_BUILD_CUDA=0 pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /tmp/wheels .

# Stage 2: Airflow with the locked environment, the package and the DAGs; runs as the image's airflow user
# (uid 50000, group 0, as the official image documents), given by number so runAsNonRoot can check it.
FROM apache/airflow:slim-${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION
USER 0
# Java 17 for spark-submit (Spark stages under the LocalExecutor); /data is the shared data root, and the
# airflow user writes the extras' requirements list into /opt/airflow/requirements.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir /data /opt/airflow/requirements \
    && chown 50000:0 /data /opt/airflow/requirements
USER 50000:0
WORKDIR /opt/airflow/requirements
# Every stage's extras and the providers at their locked versions (-c), plus the database drivers; before
# the wheel, so code changes reuse this layer. apache-airflow is named so pip never moves it; torch comes
# from the CPU index (the lock's 2.13.0 as 2.13.0+cpu).
COPY --chown=airflow:0 requirements.lock setup.cfg docker/extras_requirements.py \
    docker/requirements-services.lock ./
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python extras_requirements.py setup.cfg airflow crawl spark tokenize train tracking quality evaluate \
        > runtime-requirements.txt \
    && pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" \
        "apache-airflow==${AIRFLOW_VERSION}" \
        -c requirements.lock -r runtime-requirements.txt -r requirements-services.lock
COPY --from=build --chown=airflow:0 /tmp/wheels /tmp/wheels
RUN pip install --no-cache-dir --no-deps /tmp/wheels/pretrain_pipeline-*.whl \
    && pip check \
    && rm -rf /tmp/wheels
WORKDIR /opt/airflow
COPY --chown=airflow:0 dags /opt/airflow/dags
ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/airflow/dags \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    PRETRAIN__PROJECT__DATA_ROOT=/data
